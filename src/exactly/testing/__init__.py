"""Support for running and testing ``exactly`` from outside the broker process.

* :mod:`exactly.testing.broker` - the one broker launcher: ``exactly serve`` as a subprocess on a
  free loopback port with its own data dir and log file; stop, kill -9 and restart on the same dir.
  The test suite, the benchmarks, the Spark benchmark and ``make run`` all start brokers with it.
* :mod:`exactly.testing.wait` - ``wait_until``: poll a condition with a deadline and fail with a
  message that says what was awaited.

Nothing here is imported by the broker itself; it lives in the package (rather than in tests/) so
that the demo, which ships in the package, can use it.
"""
