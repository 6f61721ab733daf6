"""Support for running and testing ``exactly`` from outside the broker process.

* ``exactly.testing.broker()`` / ``exactly.testing.cluster()`` - context managers for an
  application's tests (:mod:`exactly.testing.harness`): a throw-away broker, or ZooKeeper and
  three brokers, each on free loopback ports with temporary data removed afterwards::

      with exactly.testing.broker({"num.partitions": 3}) as b:
          Producer({"bootstrap.servers": b.bootstrap_servers})

* :mod:`exactly.testing.pytest_plugin` - the same as pytest fixtures (``exactly_broker``,
  ``exactly_broker_session``, ``exactly_broker_factory``, ``exactly_cluster``), registered
  through the ``pytest11`` entry point when the package is installed.
* :mod:`exactly.testing.broker` - the one broker launcher (``Broker``): ``exactly serve`` as a
  subprocess on a free loopback port with its own data dir and log file; stop, kill -9 and restart
  on the same dir. The test suite, the benchmarks, the Spark benchmark and ``make run`` all start
  brokers with it.
* :mod:`exactly.testing.wait` - ``wait_until``: poll a condition with a deadline and fail with a
  message that says what was awaited.

The name ``broker`` on this package is the context manager, not the launcher module: the module
is imported here first, so ``from exactly.testing.broker import Broker`` (which reads
``sys.modules``) keeps working, while attribute access ``exactly.testing.broker`` and
``import exactly.testing.broker as m`` give the function.

Nothing here is imported by the broker itself; it lives in the package (rather than in tests/) so
that the demo, which ships in the package, and applications' test suites can use it.
"""

from exactly.testing.harness import BrokerHandle, ClusterHandle, ClusterTimeout, broker, cluster

__all__ = ["BrokerHandle", "ClusterHandle", "ClusterTimeout", "broker", "cluster"]
