"""``python -m cpbench model=foldcp/boltz2`` end to end on the CPU, real worker processes over gloo:
an inference timing on a 2x2 grid and an inference max-N probe at cp=1 under a ``memory.limit_gib``
cap, and what their records say. (Training through the same hooks is checked against cp=1 in
``tests/distributed/test_foldcp_parity.py``; a training timing through the CLI costs ~40 s here.)

Tiny sizes (c_s 32, c_z 16, 1-2 blocks, triangle attention 2 heads x 8), fp32. Under 0.125 GiB
the probe measured here fits N=128 and runs out of memory at 256 (a CPU cap counts the whole
process heap: DTensor's caches and gloo's buffers as well as tensors). About 40 s on 2 cores.
Skipped where Fold-CP is not installed (``bash scripts/install_foldcp.sh``, ``docs/peers.md``).
"""

from __future__ import annotations

import json
import re

import pytest

from cpbench.models.foldcp import is_foldcp_installed

from helpers.run import run_cpbench

pytestmark = [pytest.mark.foldcp,
              pytest.mark.skipif(not is_foldcp_installed(),
                                 reason="Fold-CP is not installed: bash scripts/install_foldcp.sh (docs/peers.md)")]

TINY = ["model.c_s=32", "model.c_z=16", "model.heads_single=2", "model.heads_tri=2", "model.head_dim_tri=8",
        "device=cpu", "dtype=fp32", "workflow.recycles=0"]


def _run(tmp_path, name: str, args: list[str]) -> tuple[dict, str]:
    run_dir = tmp_path / name
    proc = run_cpbench(["model=foldcp/boltz2", *TINY, *args, f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = [line for line in proc.stdout.splitlines() if line.startswith("cpbench ")]
    return json.loads((run_dir / "result.json").read_text()), summary[-1]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("foldcp_cli")
    timing = _run(tmp, "timing", ["topology=2d", "cp=4", "N=14", "model.blocks=1", "routine=timing"])
    probe = _run(tmp, "probe", ["topology=2d", "cp=1", "model.blocks=2", "routine=probe", "memory.limit_gib=0.125",
                                "probe.start=128", "probe.granularity=128", "probe.verify=false"])
    return timing, probe


def test_timing_on_a_2x2_grid_records_fold_cp_and_its_kernels(records):
    (rec, line), _ = records
    assert rec["status"] == "ok" and rec["point"]["cp"] == 4 and rec["point"]["mesh_shape"] == [2, 2], rec["message"]
    assert len(rec["times_ms"]) == 5 and rec["median_ms"] > 0 and len(rec["peak_alloc_gib_per_rank"]) == 4
    stats = rec["stats"]
    assert stats["grid"] == "1x2x2" and stats["kernels"] == "reference"
    assert stats["kernel_backends"] == {"tri_attn": "reference", "pair_bias": "reference"}
    assert re.fullmatch(r"boltz 2\.2\.1 \(Fold-CP [0-9a-f]{7}\)", stats["package"])
    assert set(stats["stage_ms"]) == {"trunk"} and rec["point"]["model"]["name"] == "foldcp-boltz2"
    assert "inference 2d cp=4" in line and "status ok" in line


def test_inference_probe_finds_an_oom_bounded_max_n(records):
    _, (rec, line) = records
    assert rec["status"] == "ok" and rec["point"]["memory_limit_gib"] == 0.125, rec["message"]
    assert rec["max_n"] >= 128 and rec["first_fail_status"] == "oom"
    assert rec["first_fail_n"] - rec["max_n"] <= 128 and rec["depth"] == 2
    assert f"max N = {rec['max_n']}" in line


def test_an_emulated_2x2_step_leaves_fold_cps_collectives_out(tmp_path):
    """``emulate=true`` on Fold-CP's 2x2 grid: one worker (rank 0 over the fake group) runs the
    step, and what stands for its collectives (its DTensor redistributes, all-gathers, ring
    receives) is clocked and left out of the step's time (``emulation_fill_ms``, one per repeat).
    With ``memory.breakdown=true``: what rank 0 keeps at its peak, its weights as Fold-CP's DTensors'
    local shards, and the step's share charged to Fold-CP's own functions."""
    rec, line = _run(tmp_path, "emulated", ["topology=2d", "cp=4", "N=16", "model.blocks=1", "routine=timing",
                                            "emulate=true", "memory.breakdown=true"])
    assert rec["status"] == "ok" and rec["point"]["mesh_shape"] == [2, 2], rec["message"]
    assert len(rec["peak_alloc_gib_per_rank"]) == 1 and rec["stats"]["grid"] == "1x2x2"
    assert len(rec["emulation_fill_ms"]) == len(rec["times_ms"]) == 5
    assert all(ms > 0 for ms in rec["emulation_fill_ms"])
    assert "emulated" in line
    breakdown = rec["memory_breakdown"]
    assert breakdown["rank"] == 0 and breakdown["held_gib"]["parameters"] > 0, breakdown
    assert any(s["site"].startswith("boltz/") for s in breakdown["sites"]), breakdown["sites"]
