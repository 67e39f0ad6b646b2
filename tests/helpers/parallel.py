"""The suite on several cores (pytest-xdist, ``-n auto --dist loadgroup`` in pyproject.toml).

Most of a test's time on a 2-core machine is process starts and single-threaded Python (each
worker process imports torch; a training step imports ``torch._dynamo`` through AdamW), so two
test processes side by side finish the suite in far less time than one. Two rules keep them
from distorting each other:

* ``pin_this_worker``: each xdist worker runs on its own share of the cores (CPU affinity,
  inherited by every process a test starts). cpbench sizes a point's intra-op threads from its
  affinity (``harness.env.usable_cpu_count``), so two tests never put more threads on a core
  than it has: oversubscribed threads make every parallel region wait for a descheduled one
  (a tiny training step at N=128 took 150 s instead of 8.6 s so, docs/perf_notes.md).
* ``group_shared_fixtures``: tests that share a module- or session-scoped fixture (a sweep
  several tests read) run in one worker, so the fixture runs once; the SLURM tests share one
  two-CPU cluster and run in one worker, one after another.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

SLURM_GROUP = "slurm"


def pin_this_worker() -> None:
    """In an xdist worker (``PYTEST_XDIST_WORKER=gw<i>`` of ``PYTEST_XDIST_WORKER_COUNT``): run on
    every ``count``-th of the cores this process may use, from the ``i``-th; elsewhere nothing."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    index = int(worker.removeprefix("gw"))
    mine = cores[index % len(cores)::count] or cores  # more workers than cores: they share
    os.sched_setaffinity(0, mine)
    import torch  # this process's own intra-op pool (in-process tests) to match

    torch.set_num_threads(len(mine))


def group_shared_fixtures(items: list[pytest.Item]) -> None:
    """Give every test an ``xdist_group``: the SLURM tests one group, tests connected through a
    module- or session-scoped fixture one group each (a union over the fixtures they share),
    every other test its own (``loadgroup`` then spreads them like ``load``)."""
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    for item in items:
        node = f"test:{item.nodeid}"
        if item.get_closest_marker("slurm"):
            union(node, SLURM_GROUP)
        info = getattr(item, "_fixtureinfo", None)
        for name, defs in (info.name2fixturedefs.items() if info else ()):
            fixture = defs[-1]
            if fixture.scope in ("session", "package", "module") and _ours(fixture.func, item.config.rootpath):
                owner = "" if fixture.scope != "module" else item.module.__name__
                union(node, f"fixture:{owner}:{name}")
    for item in items:
        root = find(f"test:{item.nodeid}")
        if root != f"test:{item.nodeid}":  # joined to a fixture or the SLURM group
            item.add_marker(pytest.mark.xdist_group(root))


def _ours(func, root: Path) -> bool:
    """Whether a fixture is defined in the project's own files under ``root`` (pytest's own and
    plugins' fixtures, such as the session-scoped ``tmp_path_factory`` that nearly every test
    uses, live in site-packages, which may itself lie under the root: ``.venv``)."""
    try:
        path = Path(inspect.getfile(func)).resolve()
    except (TypeError, OSError):  # a builtin or C function: not ours
        return False
    return path.is_relative_to(root.resolve()) and "site-packages" not in path.parts
