"""The suite's parallel run (``tests/helpers/parallel.py``) with the installed pytest and xdist: tests
that share a session fixture run in one process, and each process runs on its own cores. (On
pytest 9.2 xdist's grouping stopped working without a word, pytest-dev/pytest-xdist#1386: the
shared sweeps then ran once per process.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers.run import REPO_ROOT

pytest.importorskip("xdist")

CONFTEST = f"""
import json, os, sys
import pytest
sys.path.insert(0, {str(REPO_ROOT / "tests")!r})
from helpers.parallel import group_shared_fixtures, pin_this_worker

pin_this_worker()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    group_shared_fixtures(items)


@pytest.fixture(scope="session")
def shared():
    return os.getpid()


def record(name, **extra):
    out = {{"pid": os.getpid(), "cores": sorted(os.sched_getaffinity(0)), **extra}}
    with open(os.path.join(os.environ["RECORD_DIR"], name + ".json"), "w") as f:
        json.dump(out, f)
"""

SHARING = """
from conftest import record
import pytest

@pytest.mark.parametrize("i", range(4))
def test_shared(shared, i):
    record(f"{__name__}-{i}", fixture_pid=shared)
"""

ALONE = """
from conftest import record
import pytest

@pytest.mark.parametrize("i", range(4))
def test_alone(i):
    record(f"alone-{i}")
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity API here")
def test_tests_sharing_a_session_fixture_run_in_one_pinned_process(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_one.py").write_text(SHARING)
    (tmp_path / "test_two.py").write_text(SHARING)
    (tmp_path / "test_three.py").write_text(ALONE)
    records = tmp_path / "records"
    records.mkdir()
    env = {**os.environ, "RECORD_DIR": str(records)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "xdist", "-n", "2", "--dist", "loadgroup"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    runs = {path.stem: json.loads(path.read_text()) for path in records.glob("*.json")}
    assert len(runs) == 12, sorted(runs)
    sharing = [r for name, r in runs.items() if name.startswith("test_")]
    assert len({r["pid"] for r in sharing} | {r["fixture_pid"] for r in sharing}) == 1, sharing  # one process
    by_pid = {r["pid"]: tuple(r["cores"]) for r in runs.values()}
    usable = len(os.sched_getaffinity(0))
    if len(by_pid) == 2 and usable >= 2:  # both processes ran tests: disjoint shares of the cores
        first, second = by_pid.values()
        assert not set(first) & set(second) and len(first) + len(second) <= usable, by_pid
