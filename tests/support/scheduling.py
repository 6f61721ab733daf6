"""How ``make test`` (``pytest -n 2 --dist loadgroup``) spreads the suite over its two workers.

The run's wall time is the busier worker's: the other one idles once the queue is empty. Three
rules keep the two finishing together, and the run to one Spark JVM:

* **The Spark group.** Every test that uses the session's in-process SparkSession (the ``spark``
  fixture) gets ``xdist_group("spark")``, so they all run on one worker, which starts the one JVM
  (Spark takes 10-20 s and about a gigabyte to start). Tests that run Spark in subprocesses of
  their own (the crash tests, the CLI, the standalone cluster, Spark Declarative Pipelines) are
  not in the group: either worker may take them.
* **Longest first.** pytest-xdist's loadgroup scheduler hands out work units (a group, or one
  ungrouped test) biggest group first, then in collection order, one unit whenever a worker has
  two tests or fewer left. The Spark group, the biggest unit, therefore starts at once on one
  worker; the collection is reordered so that the tests marked ``slow`` come next, ahead of the
  short ones, the slow ones that declare the longest ``timeout`` first (a stable sort: otherwise
  in collection order). The long tests then start while the
  other worker has plenty of short ones left to balance them, and the run ends with short tests
  on both workers instead of one worker finishing a minutes-long crash test alone.
* **The group suffix.** xdist tells its scheduler a test's group by appending ``@<group>`` to the
  node id on the worker. It does that by assigning ``item._nodeid``, which pytest 9.2's node ids
  (a structured ``NodeId`` in ``item._id``) no longer read, so under pytest 9.2 with
  pytest-xdist 3.8 ``--dist loadgroup`` silently distributes grouped tests like any other (each
  worker then started its own Spark). ``add_group_suffix`` sets the suffix on the id pytest
  reads, unless xdist already did, and the worker refuses to run when a grouped test's node id
  still lacks it, so a future pytest or xdist cannot silently undo the grouping again.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import pytest
from _pytest.nodeid import NodeId

SPARK_GROUP = "spark"
SPARK_FIXTURE = "spark"


def group_of(item: pytest.Item) -> str | None:
    """The item's xdist group, named as xdist names it (several marks: their sorted names joined)."""
    names = {
        str(m.args[0] if m.args else m.kwargs.get("name", "default"))
        for m in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) if names else None


def declared_timeout(item: pytest.Item) -> float:
    """The item's ``timeout`` mark (pytest-timeout), 0 without one."""
    mark = item.get_closest_marker("timeout")
    if mark is None:
        return 0.0
    value = mark.args[0] if mark.args else mark.kwargs.get("timeout", 0)
    return float(value or 0)


def slow_first(items: Sequence[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the ``slow``-marked ones first, those declaring the longest timeout first among
    them (the Spark jobs in subprocesses: 600-900 s), the rest in their original order."""

    def rank(item: pytest.Item) -> tuple[bool, float]:
        slow = item.get_closest_marker("slow") is not None
        return (not slow, -declared_timeout(item) if slow else 0.0)

    return sorted(items, key=rank)


def _loadgroup(config: pytest.Config) -> bool:
    """True in an xdist worker of a ``--dist loadgroup`` run (xdist sets the option there; the
    controller does not collect)."""
    return bool(getattr(config.option, "loadgroup", False))


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Generator[None]:
    # before every other implementation, xdist's included (it reads the marks)
    for item in items:
        if SPARK_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(SPARK_GROUP))
    if not _loadgroup(config):  # one process: the order cannot shorten the run; keep the file order
        return (yield)
    items[:] = slow_first(items)
    yield  # xdist's hook adds the @<group> suffix (which pytest 9.2 does not read)
    add_group_suffix(items)
    missing = [item.nodeid for item in items if (g := group_of(item)) and not item.nodeid.endswith(f"@{g}")]
    if missing:  # a RuntimeError: the controller prints a worker's message (a UsageError it swallows)
        raise RuntimeError(
            f"--dist loadgroup would not group {len(missing)} tests (e.g. {missing[0]}): their node "
            "ids lack xdist's @<group> suffix (tests/support/scheduling.py)"
        )


def add_group_suffix(items: Sequence[pytest.Item]) -> None:
    """Append ``@<group>`` to each grouped item's node id, unless it already ends with it."""
    for item in items:
        group = group_of(item)
        if group is not None and not item.nodeid.endswith(f"@{group}"):
            item._id = NodeId.parse(f"{item.nodeid}@{group}")
