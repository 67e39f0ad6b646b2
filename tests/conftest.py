"""Pytest setup: the repository root on every subprocess's ``PYTHONPATH`` (worker processes
import the test adapters in ``tests/helpers/faults.py``) and ``tests/`` on ``sys.path`` (the
``helpers`` package); the CPU timing multirun that the report tests share.

Layout: ``unit/`` (no worker processes), ``distributed/`` (gloo parity of the sharded code),
``memory/`` (peak-memory bounds), ``e2e/`` (``python -m cpbench`` and real worker processes),
``cluster/`` (a real SLURM cluster, marker ``slurm``). Marker ``slow``: the longest tests.

The suite runs one process per core (pytest-xdist): each pinned to its cores, tests that share a
fixture in one process (``helpers/parallel.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
# Without a GPU, Triton kernels (ops/triton_passes.py) run in Triton's interpreter on CPU tensors;
# the variable is read when a kernel is defined, so before any test imports one.
if not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
for path in (str(REPO_ROOT), str(TESTS_DIR)):  # tests.helpers (config validation here), helpers
    if path not in sys.path:
        sys.path.insert(0, path)

from helpers.parallel import group_shared_fixtures, pin_this_worker  # noqa: E402 - needs the paths above
from helpers.run import TIMING_MULTIRUN_ARGS, run_cpbench  # noqa: E402


@pytest.fixture(scope="session")
def timing_multirun(tmp_path_factory) -> Path:
    """Sweep dir of ``python -m cpbench -m workflow=inference,training cp=1,2 N=16,32 S=16
    model=tiny device=cpu routine=timing`` (8 jobs); the report tests reuse it."""
    launch_dir = tmp_path_factory.mktemp("timing_multirun")
    sweep_dir = launch_dir / "sweep"
    proc = run_cpbench([*TIMING_MULTIRUN_ARGS, f"hydra.sweep.dir={sweep_dir}"], cwd=launch_dir, timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir


pin_this_worker()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    group_shared_fixtures(items)
