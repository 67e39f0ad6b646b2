"""``hydra/launcher=slurm`` on a real SLURM cluster (CPU, gloo, one task per rank).

They run only with ``CPBENCH_TEST_SLURM=1`` (``helpers.cluster``: they submit real jobs, so a
cluster that merely answers ``sinfo`` is not enough); CI sets it and starts a one-node cluster with
``.ci/slurm_up.sh`` first. Without the opt-in, or without a cluster answering, they are skipped.
They run the test adapter (``tests/helpers/faults.py``), so their time is SLURM's and the
workers' start-up, not the model's.

A point's signature includes a hash of cpbench's sources, so a requeued or resumed job in a
tree being edited would (correctly) be a new point: the jobs run a frozen copy of the code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cluster import cluster_skip_reason
from helpers.run import REPO_ROOT, fault_model

pytestmark = pytest.mark.slurm

LAUNCHER = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.poll_s=1",
            "hydra.launcher.timeout_min=10", "hydra.launcher.cpus_per_task=1", "device=cpu"]


@pytest.fixture(scope="module", autouse=True)
def _cluster():
    reason = cluster_skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def code_snapshot(tmp_path_factory) -> Path:
    """cpbench (its config tree inside) as it is now, put first on PYTHONPATH of the controller and its jobs."""
    root = tmp_path_factory.mktemp("code")
    for name in ("cpbench",):
        shutil.copytree(REPO_ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _cpbench(args: list[str], cwd: Path, code: Path, launcher: list[str] = LAUNCHER) -> subprocess.Popen:
    """``python -m cpbench -m <launcher> ARGS`` in ``cwd``, running the code in ``code``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "cpbench", "-m", *launcher, *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _finish(proc: subprocess.Popen, timeout_s: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the controller did not finish in {timeout_s} s:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-4000:]
    return out


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


def _manifest_job_id(sweep_dir: Path) -> str | None:
    try:
        return json.loads((sweep_dir / "slurm_jobs.json").read_text())["jobs"][0]["slurm_job_id"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _job_field(job_id: str, field: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    m = re.search(rf"\b{field}=(\S+)", out.stdout)
    return m.group(1) if m else ""


def _job_state(job_id: str) -> str:
    return _job_field(job_id, "JobState")


def _release_requeued(job_id: str) -> bool:
    """SLURM holds a requeued job for about two minutes (BeginTime): start it now. True once it runs again."""
    state = _job_state(job_id)
    if state not in ("RUNNING", "COMPLETED"):  # PENDING, or still REQUEUED/COMPLETING: ask early, errors are harmless
        subprocess.run(["scontrol", "update", f"jobid={job_id}", "starttime=now"], capture_output=True, timeout=30)
    # The interrupt is asynchronous (submitit requeues from its signal handler): count restarts.
    return _job_field(job_id, "Restarts") not in ("", "0") and state in ("RUNNING", "COMPLETED")


def _result(sweep_dir: Path, num: int) -> dict:
    return json.loads((sweep_dir / str(num) / "result.json").read_text())


def test_slurm_multirun_cp_1_2_writes_a_result_per_point_and_the_report(tmp_path, code_snapshot):
    sweep_dir, report_out = tmp_path / "sweep", tmp_path / "docs" / "cp_benchmark.md"
    args = ["cp=1,2", "routine=timing", "N=32", *fault_model("none"), f"hydra.sweep.dir={sweep_dir}",
            f"report.out={report_out}"]
    out = _finish(_cpbench(args, tmp_path, code_snapshot))

    records = [_result(sweep_dir, num) for num in (0, 1)]
    assert [r["status"] for r in records] == ["ok", "ok"], [r.get("message") for r in records]
    assert [r["point"]["cp"] for r in records] == [1, 2]
    # cp=2 ran as two SLURM tasks (two supervisors over gloo), each rank measured.
    assert len(records[1]["peak_alloc_gib_per_rank"]) == 2
    assert len(records[1]["times_ms"]) == 5

    manifest = json.loads((sweep_dir / "slurm_jobs.json").read_text())["jobs"]
    assert [(j["cp"], j["nodes"], j["tasks_per_node"], j["gpus_per_node"]) for j in manifest] == [
        (1, 1, 1, 0), (2, 1, 2, 0)]
    script = (sweep_dir / ".submitit" / manifest[1]["slurm_job_id"] / f"{manifest[1]['slurm_job_id']}_submission.sh")
    text = script.read_text()
    assert "--ntasks-per-node=2" in text and "gpus" not in text
    # Both tasks of the cp=2 job ran (submitit's per-task logs).
    assert Path(manifest[1]["stdout"]).exists() and Path(manifest[1]["stdout"].replace("_0_log", "_1_log")).exists()

    report = (sweep_dir / "cp_benchmark.md").read_text()
    assert "1d cp=1" in report and "1d cp=2" in report
    assert report_out.exists()
    assert "[2/2] SLURM job" in out

    # Re-submitting with resume=true runs only the missing point.
    kept = (sweep_dir / "1" / "result.json").read_text()
    (sweep_dir / "0" / "result.json").unlink()
    out = _finish(_cpbench([*args, "resume=true"], tmp_path, code_snapshot))
    manifest_again = json.loads((sweep_dir / "slurm_jobs.json").read_text())["jobs"]
    assert "submitting 1 SLURM job(s)" in out, out[-3000:]
    assert manifest_again[1] == manifest[1] and manifest_again[0]["slurm_job_id"] != manifest[0]["slurm_job_id"]
    assert (sweep_dir / "1" / "result.json").read_text() == kept
    assert _result(sweep_dir, 0)["status"] == "ok"


@pytest.mark.parametrize("interrupt", [
    ["scontrol", "requeue"],                      # an operator's requeue: SIGTERM, then SLURM requeues
    ["scancel", "--signal=USR2"],                 # the time-limit signal: submitit checkpoints, requeues
], ids=["scontrol_requeue", "submitit_timeout_signal"])
def test_slurm_requeued_probe_continues_from_its_saved_points(tmp_path, interrupt, code_snapshot):
    """Interrupting the running probe requeues it; the requeued job measures only what is left."""
    sweep_dir = tmp_path / "sweep"
    # Rank 1 exits above N=40: from 16 the probe measures 16, 32 (fit), 64 (fail); the requeue
    # lands after 16, while 32 runs (a point that must still be recorded as fitting).
    proc = _cpbench(["cp=2", "routine=probe", "probe.start=16", "probe.granularity=32", "probe.timeout_s=60",
                     *fault_model("exit", threshold_n=40), f"hydra.sweep.dir={sweep_dir}", "report.out=null"],
                    tmp_path, code_snapshot)
    try:
        job_id = _wait_for(lambda: _manifest_job_id(sweep_dir), 60, "the submission")
        state_path = sweep_dir / "0" / "probe_state.json"

        def first_point():
            try:
                return json.loads(state_path.read_text())["points"]
            except (OSError, ValueError, KeyError):
                return None

        before = _wait_for(first_point, 90, "the first probe point")
        subprocess.run([*interrupt, job_id], check=True, timeout=30)
        _wait_for(lambda: _release_requeued(job_id), 120, "the requeued job to run again")
    except BaseException:
        proc.kill()
        raise
    _finish(proc)

    record = _result(sweep_dir, 0)
    points = {p["N"]: p for p in record["points"]}
    assert record["status"] == "ok", record["message"]
    assert {n: p["fits"] for n, p in points.items()} == {16: True, 32: True, 64: False}
    assert (record["max_n"], record["first_fail_n"]) == (32, 64)
    # The points measured before the requeue were kept, not measured again.
    for p in before:
        assert points[p["N"]]["seconds"] == p["seconds"]
    # It really ran twice: submitit's log of task 0 has two starts.
    log = (sweep_dir / ".submitit" / job_id / f"{job_id}_0_log.out").read_text()
    assert log.count("Starting with JobEnvironment") == 2, log[-2000:]


@pytest.mark.parametrize("wait", [True, False], ids=["controller_waits", "collected_later"])
def test_slurm_cancelled_job_becomes_a_result_row_and_the_sweep_completes(tmp_path, wait, code_snapshot):
    sweep_dir = tmp_path / "sweep"
    # Rank 1 hangs at every N: the job runs until SLURM ends it.
    proc = _cpbench(["cp=2", "routine=timing", "N=32", "timing.timeout_s=600", *fault_model("hang", threshold_n=0),
                     f"hydra.launcher.wait={str(wait).lower()}", f"hydra.sweep.dir={sweep_dir}",
                     f"report.out={tmp_path / 'report.md'}"], tmp_path, code_snapshot)
    try:
        job_id = _wait_for(lambda: _manifest_job_id(sweep_dir), 60, "the submission")
        if not wait:
            assert job_id in _finish(proc)  # returned at once, printing the job id
        _wait_for(lambda: _job_state(job_id) == "RUNNING", 120, "the job to run")
        subprocess.run(["scancel", job_id], check=True, timeout=30)
    except BaseException:
        proc.kill()
        raise
    if wait:
        _finish(proc)
    else:
        later = subprocess.run([sys.executable, "-m", "cpbench.sweep.collect", str(sweep_dir), "--wait",
                                "--poll-s", "1"], capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, PYTHONPATH=f"{code_snapshot}{os.pathsep}{os.environ['PYTHONPATH']}"))
        assert later.returncode == 0, later.stderr[-3000:]
        assert "1 job(s) over, 0 still queued or running" in later.stdout

    record = _result(sweep_dir, 0)
    assert record["status"] == "error"
    assert record["slurm"]["state"] == "CANCELLED" and record["slurm"]["job_id"] == job_id
    assert f"SLURM job {job_id} CANCELLED" in record["message"]
    assert record["point"]["cp"] == 2 and record["signature"] is None  # resume=true runs it again
    assert "1d cp=2" in (sweep_dir / "cp_benchmark.md").read_text()


def test_slurm_point_the_cluster_cannot_hold_becomes_a_row(tmp_path, code_snapshot):
    """cp=4 on the CI node (2 CPUs, one task per rank) pends for ever: cancelled, a row, the report."""
    sweep_dir = tmp_path / "sweep"
    out = _finish(_cpbench(["cp=4", "routine=timing", "N=32", *fault_model("none"), f"hydra.sweep.dir={sweep_dir}",
                            f"report.out={tmp_path / 'report.md'}"], tmp_path, code_snapshot), timeout_s=120)
    record = _result(sweep_dir, 0)
    job_id = record["slurm"]["job_id"]
    assert record["status"] == "error" and record["slurm"]["state"] == "PENDING"
    assert record["slurm"]["reason"] == "PartitionConfig" and "can never start" in record["message"]
    assert f"SLURM job {job_id} cannot start" in out
    assert _job_state(job_id) == "CANCELLED"
    assert "1d cp=4" in (sweep_dir / "cp_benchmark.md").read_text()
