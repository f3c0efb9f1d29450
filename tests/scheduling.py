"""The order the parallel workers are handed the tests in (``--dist loadgroup`` hands out
work in collection order, pyproject turns off xdist's own reordering): the long tests early,
so that none of them is the last work handed out while the other workers sit idle (xdist's
own order put tests/replicas, tests/security and the README test near the end).

The modules below hold tests of 20 s and more each (``--durations`` of the default run on a
loaded 2-core machine, at 1e12dce), longest first. tests/app/test_serve_processes.py is
long only when loaded and stays where it was. The others
keep xdist's order: groups of tests that share servers first, the largest first, then
everything else as collected.
"""

from __future__ import annotations

from collections import Counter

import pytest

LONG_MODULES = (
    "tests/api/test_schemathesis.py",
    "tests/notifications/test_replicas.py",
    "tests/app/test_dev.py",
    "tests/replicas/test_crash.py",
    "tests/pipeline/test_cli.py",
    "tests/security/test_barrier_blocks.py",
    "tests/test_readme.py",
    "tests/pipeline/test_model.py",
    "tests/replicas/test_rolling.py",
    "tests/replicas/test_replicas.py",
    "tests/knowledge/test_document_limits.py",
    "tests/providers/test_limits.py",
    "tests/inbound/mattermost/test_replicas.py",
    "tests/pipeline/test_restore.py",
    "tests/leases/test_maintenance.py",
    "tests/inbound/test_admission_exact.py",
)
_RANK = {module: rank for rank, module in enumerate(LONG_MODULES)}


def longest_first(items: list[pytest.Item], groups: dict[str, str]) -> None:
    """Reorder ``items`` in place; ``groups``: node id -> its xdist group, for grouped tests.

    The long modules go out one by one over the first half of the run, each followed by a
    share of the others: none is left for the end, and they do not all run at once (each
    starts processes and servers of its own, which on two cores would push them together
    past their deadlines)."""
    sizes = Counter(groups.values())
    long: dict[str, list[pytest.Item]] = {}
    rest: list[pytest.Item] = []
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        (long.setdefault(module, []) if module in _RANK else rest).append(item)
    # Stable: a module's tests stay together and in their order.
    rest.sort(key=lambda item: -sizes.get(groups.get(item.nodeid, ""), 1))
    units = [long[module] for module in LONG_MODULES if module in long]
    step = max(1, len(rest) // 2 // max(1, len(units)))
    ordered: list[pytest.Item] = []
    for index, unit in enumerate(units):
        ordered += unit + rest[index * step:(index + 1) * step]
    ordered += rest[len(units) * step:]
    items[:] = ordered
