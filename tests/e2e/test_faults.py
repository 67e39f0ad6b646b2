"""Fault injection with real worker processes (gloo, CPU): one bad rank never hangs a probe.

The test adapter's rank 1 alone fails above N=48 (CUDA OOM / sleeps for ever / exits with
code 3 / a NaN loss) while rank 0 waits in the step's all-reduce. Each probe must finish in bounded time
with max N = 48 and the right cause recorded for the failing point.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from cpbench.harness.runner import PointRun, Runner
from cpbench.harness.slots import SupervisorGroup, discover_slots
from cpbench.routines.probe import Probe

from helpers.run import compose_point, fault_model

POINT_TIMEOUT_S = 8.0


def fault_runner(fault: str, log_dir=None) -> tuple:
    point = compose_point("device=cpu", "cp=2", *fault_model(fault, threshold_n=48))
    point = replace(point, probe=replace(point.probe, start=16, granularity=16, timeout_s=POINT_TIMEOUT_S))
    slots = discover_slots(point.cp, point.device)
    return point, Runner(point, slots, SupervisorGroup(slots), log_dir=log_dir)


@pytest.mark.parametrize("fault, status, cause", [
    ("oom", "oom", "OutOfMemoryError"),
    ("hang", "timeout", "still running"),
    ("exit", "error", "exited with code 3"),
    ("nan_loss", "error", "not finite"),  # a real (not emulated) step whose loss is NaN is no fit
])
def test_probe_survives_one_failing_rank(fault, status, cause):
    point, runner = fault_runner(fault)
    out = Probe(point, runner, None, "sig").run()
    failing = out["points"][2]
    assert failing["N"] == 64 and failing["status"] == status and cause in failing["message"]
    assert all(len(p["peak_alloc_gib"]) == 2 for p in out["points"])
    if fault == "hang":  # a timeout is not a memory limit: the search stops there, max N is a lower bound
        assert out["max_n"] == 32 and out["first_fail_n"] is None and out["timed_out_n"] == [64]
        assert [(p["N"], p["fits"]) for p in out["points"]] == [(16, True), (32, True), (64, False)]
        assert "lower bound" in out["message"]
        return
    assert out["max_n"] == 48 and out["first_fail_n"] == 64
    assert [(p["N"], p["fits"]) for p in out["points"]] == [(16, True), (32, True), (64, False), (48, True)]
    assert out["first_fail_status"] == status
    assert failing["seconds"] < POINT_TIMEOUT_S  # a failure is agreed after a short grace, far before the point timeout


def test_oom_on_rank_1_is_the_cause_even_when_rank_0_errors_in_its_collective():
    point, runner = fault_runner("oom")
    result = runner.run(PointRun(N=64, n_atoms=512, S=4, timeout_s=POINT_TIMEOUT_S))
    assert result.status == "oom" and result.message.startswith("rank 1:")
    assert result.ranks[1]["status"] == "oom"
    assert result.ranks[0]["status"] != "ok"  # it never completed the all-reduce


def test_a_crashed_rank_is_an_error_that_says_where_it_died():
    """A native crash leaves no report: the point is an error whose message quotes faulthandler's
    line and the innermost frame of the crashing rank (here the test adapter's ``_fail``)."""
    point, runner = fault_runner("segfault")
    result = runner.run(PointRun(N=64, n_atoms=512, S=4, timeout_s=POINT_TIMEOUT_S))
    assert result.status == "error" and result.message.startswith("rank 1:"), result.message
    assert "exited with code -11" in result.message and "Segmentation fault" in result.message, result.message
    assert "faults.py" in result.message and "_fail" in result.message, result.message


def test_a_failed_rank_leaves_its_traceback_in_the_job_folder(tmp_path):
    """The failing rank's whole log (its traceback, not only the one-line message) outlives the
    point's temporary folder; the ranks that completed or were killed leave none."""
    point, runner = fault_runner("raise", log_dir=tmp_path)
    assert runner.run(PointRun(N=32, n_atoms=256, S=4, timeout_s=POINT_TIMEOUT_S)).status == "ok"
    assert not (tmp_path / "worker_logs").exists()
    result = runner.run(PointRun(N=64, n_atoms=512, S=4, timeout_s=POINT_TIMEOUT_S))
    assert result.status == "error" and "cpbench_test_missing" in result.message, result.message
    assert [p.name for p in (tmp_path / "worker_logs").iterdir()] == ["N64-rank1.log"]
    text = (tmp_path / "worker_logs" / "N64-rank1.log").read_text()
    assert "Traceback" in text and "_import_a_missing_module" in text and "cpbench_test_missing" in text, text


@pytest.mark.parametrize("statuses, kept", [
    ({0: ("error", "Connection closed by peer"), 1: ("oom", "CUDA out of memory")}, []),  # the probe's usual OOM
    ({0: ("error", "Connection closed by peer"), 1: ("error", "ValueError: bad shape")}, [1]),
    ({0: ("error", "Connection closed by peer"), 1: ("killed", "killed after a peer failed")}, [0]),  # echoes only
    ({0: ("timeout", "still running"), 1: ("ok", "")}, [0]),
])
def test_which_worker_logs_are_kept(tmp_path, statuses, kept):
    work = tmp_path / "work"
    work.mkdir()
    for rank in statuses:
        (work / f"rank{rank}.log").write_text(f"log of rank {rank}\n")
    outcomes = [{"rank": r, "status": st, "message": msg} for r, (st, msg) in statuses.items()]
    Runner._keep_logs(SimpleNamespace(log_dir=tmp_path / "job"), outcomes, work, 64)
    logs = tmp_path / "job" / "worker_logs"
    found = sorted(p.name for p in logs.iterdir()) if logs.exists() else []
    assert found == [f"N64-rank{r}.log" for r in kept]


def test_an_out_of_memory_point_keeps_no_echo_logs(tmp_path):
    """Rank 1 runs out of memory and rank 0 errors in its collective (a peer's echo): an ordinary
    probe verdict, which leaves no worker log."""
    point, runner = fault_runner("oom", log_dir=tmp_path)
    result = runner.run(PointRun(N=64, n_atoms=512, S=4, timeout_s=POINT_TIMEOUT_S))
    assert result.status == "oom"
    assert not (tmp_path / "worker_logs").exists()


def test_a_timed_out_timing_point_says_how_far_it_got():
    """Rank 1 finishes two steps, then hangs: the timeout verdict reports those two steps."""
    point, runner = fault_runner("hang_later")
    result = runner.run(PointRun(N=64, n_atoms=512, S=4, timeout_s=POINT_TIMEOUT_S, warmup=3, repeats=5))
    assert result.status == "timeout"
    assert "after 2 steps (warmup" in result.message, result.message
    assert all(len(r["progress"]["warmup_ms"]) == 2 for r in result.ranks), result.ranks
