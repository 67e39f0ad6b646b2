"""Rank slots, verdicts, and two supervisors (torchrun) agreeing on a failing point."""

from __future__ import annotations

import sys

from cpbench.harness.runner import verdict
from cpbench.harness.slots import discover_slots, free_port
from cpbench.results import read_json

from helpers.run import fault_model, run_command


def test_local_slots_own_every_rank(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "SLURM_JOB_ID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    slots = discover_slots(4, "cpu")
    assert slots.mode == "local" and slots.ranks == (0, 1, 2, 3) and slots.num_supervisors == 1


def test_torchrun_env_gives_one_rank_per_supervisor(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "node7")
    monkeypatch.setenv("MASTER_PORT", "29500")
    slots = discover_slots(4, "cpu")
    assert (slots.mode, slots.ranks, slots.supervisor_rank, slots.world_size) == ("torchrun", (3,), 3, 4)
    assert (slots.master_addr, slots.master_port, slots.device_indices) == ("node7", 29500, (0,))


def test_verdict_prefers_the_oom_over_the_peer_that_lost_its_connection():
    ranks = [{"rank": 0, "status": "error", "message": "RuntimeError: Connection closed by peer", "finished_at": 1.0},
             {"rank": 1, "status": "oom", "message": "OutOfMemoryError: CUDA out of memory", "finished_at": 2.0}]
    assert verdict(ranks, False, 10) == ("oom", "rank 1: OutOfMemoryError: CUDA out of memory")


def test_verdict_of_a_crash_is_the_crashed_rank_not_its_killed_peer():
    ranks = [{"rank": 0, "status": "killed", "message": "killed after a peer failed"},
             {"rank": 1, "status": "error", "message": "exited with code 3 without a report"}]
    assert verdict(ranks, False, 10) == ("error", "rank 1: exited with code 3 without a report")


def test_verdict_of_a_hang_is_timeout_naming_the_ranks_still_running():
    ranks = [{"rank": 0, "status": "timeout"}, {"rank": 1, "status": "timeout"}]
    status, message = verdict(ranks, True, 8)
    assert status == "timeout" and "[0, 1]" in message and "8 s" in message


def test_two_torchrun_supervisors_agree_that_rank_1_ran_out_of_memory(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "cpbench", "device=cpu", "cp=2", "routine=timing", "N=64", "timing.timeout_s=60",
           *fault_model("oom", threshold_n=48), f"hydra.run.dir={run_dir}"]
    proc = run_command(cmd, tmp_path, timeout_s=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_json(run_dir / "result.json")  # written by supervisor 0 only
    assert record["status"] == "oom" and record["message"].startswith("rank 1:")
    assert record["point"]["cp"] == 2
