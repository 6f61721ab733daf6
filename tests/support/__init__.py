"""Helpers for integration tests (fixtures in tests/conftest.py).

* ``broker.Broker`` - the real broker as a subprocess (start / stop / kill -9 / restart, output log).
* ``proxy.FaultProxy`` - in-process Kafka-frame-aware TCP proxy that drops, delays, cuts, blackholes.
* ``wire.WireClient`` - blocking socket client that speaks kio-encoded requests (and raw bytes).
* ``clients`` - thin confluent-kafka wrappers (create topic, produce, consume with assign()).
* ``kcat`` - finds kcat or installs it with apt-get (root only); kcat tests skip otherwise.

Running: ``pytest tests/integration tests/cli`` (everything), ``-m "not slow"`` to leave out the
fault-injection runs. No test talks to anything but 127.0.0.1.
"""
