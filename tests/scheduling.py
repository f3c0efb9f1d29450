"""The order the parallel workers are handed the tests in (``--dist loadgroup`` hands out
work in collection order, pyproject turns off xdist's own reordering): the longest first,
so that none of them is the last work handed out while the other workers sit idle.

The modules below hold tests of 20 s and more each (``--durations`` of the default run on a
loaded 2-core machine, at 1e12dce), longest first; then the groups of tests that share
servers, the largest first (xdist's own order); then everything else as collected.
"""

from __future__ import annotations

from collections import Counter

import pytest

LONG_MODULES = (
    "tests/api/test_schemathesis.py",
    "tests/notifications/test_replicas.py",
    "tests/app/test_dev.py",
    "tests/replicas/test_crash.py",
    "tests/app/test_serve_processes.py",
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
    """Sort ``items`` in place; ``groups``: node id -> its xdist group, for grouped tests."""
    sizes = Counter(groups.values())

    def key(item: pytest.Item) -> tuple[int, int]:
        module = item.nodeid.split("::", 1)[0]
        group = groups.get(item.nodeid)
        return _RANK.get(module, len(_RANK)), -(sizes[group] if group else 1)

    items.sort(key=key)  # stable: a module's tests stay in their order
