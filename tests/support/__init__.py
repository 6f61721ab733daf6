"""Helpers for integration tests (fixtures in tests/conftest.py).

* ``broker.Broker`` - the real broker as a subprocess (start / stop / kill -9 / restart, output log);
  the launcher itself is ``exactly.testing.broker``, shared with bench/ and ``make run``.
* ``exactly.testing.wait`` - ``wait_until`` (and ``wait_until_async``): await a condition, never
  sleep for a guessed time.
* ``proxy.FaultProxy`` - in-process Kafka-frame-aware TCP proxy that drops, delays, cuts, blackholes.
* ``wire.WireClient`` - the production wire client (``exactly.client.wire``) plus raw frames.
* ``clients`` - thin confluent-kafka wrappers (create topic, produce, consume with assign()).
* ``kcat`` - finds kcat or installs it with apt-get (root only); kcat tests skip otherwise.

Running: ``pytest tests/integration tests/cli`` (everything), ``-m "not slow"`` to leave out the
fault-injection runs. No test talks to anything but 127.0.0.1.
"""
