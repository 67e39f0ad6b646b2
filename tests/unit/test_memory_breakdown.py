"""``memory.breakdown``: what a rank keeps at the peak of a step (``cpbench.harness.breakdown``).

The replay on hand-made events (the peak, the blocks freed before it, the sites ranked), the
site of a frame stack, and a real step on the CPU under the profiler: a known allocation at a
known function, the parameters, gradients, AdamW state and inputs held before it.
"""
from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from cpbench.config import ConfigError
from cpbench.harness.breakdown import GIB, TOP_SITES, Alloc, peak_breakdown, replay, site_of
from cpbench.routines.timing import peak_rank_breakdown

from helpers.run import compose_point

MIB = 1 << 20


def test_replay_finds_the_peak_and_what_is_live_there():
    held = {"parameters": {1: 8 * MIB}, "gradients": {2: 4 * MIB}, "optimizer_state": {}, "inputs": {3: 2 * MIB}}
    events = [Alloc(1, 10, 16 * MIB, "a.py:1 f"),
              Alloc(2, 2, -4 * MIB, "g"),           # a gradient freed (zero_grad set_to_none)
              Alloc(3, 11, 32 * MIB, "b.py:2 g"),
              Alloc(4, 12, 1 * MIB, "a.py:1 f"),
              Alloc(5, 11, -32 * MIB, "b.py:2 g"),  # the peak was just before this free
              Alloc(6, 13, 30 * MIB, "c.py:3 h"),   # the biggest block, but 13 + 30 MiB < the 45 before
              Alloc(7, 99, -1 * MIB, "x")]          # a block live before the step, of no owner
    out = replay(events, held, other_held_b=3 * MIB)
    assert out["held_gib"] == pytest.approx({"parameters": 8 * MIB / GIB, "gradients": 0.0, "optimizer_state": 0.0,
                                            "inputs": 2 * MIB / GIB, "other_held": 3 * MIB / GIB})
    assert out["step_gib"] == pytest.approx(49 * MIB / GIB)
    assert [s["site"] for s in out["sites"]] == ["b.py:2 g", "a.py:1 f"]
    assert out["sites"][1] == {"site": "a.py:1 f", "gib": pytest.approx(17 * MIB / GIB, abs=1e-6), "blocks": 2}
    assert out["peak_gib"] == pytest.approx((8 + 2 + 3 + 49) * MIB / GIB)
    assert out["events"] == len(events)


def test_replay_lists_the_top_sites_and_adds_up_the_rest():
    events = [Alloc(i, 100 + i, (i + 1) * MIB, f"m.py:{i} f") for i in range(TOP_SITES + 3)]
    out = replay(events, {}, other_held_b=None)
    assert len(out["sites"]) == TOP_SITES
    assert out["sites"][0]["site"] == f"m.py:{TOP_SITES + 2} f"
    assert out["other_sites_gib"] == pytest.approx((1 + 2 + 3) * MIB / GIB, abs=1e-6)
    assert "other_held" not in out["held_gib"]


def test_a_block_freed_where_the_profiler_does_not_follow_is_left_out_of_the_replay():
    events = [Alloc(1, 10, 4 * MIB, "comm.py:1 gather"),   # handed to a collective; its free not recorded
              Alloc(2, 11, 1 * MIB, "comm.py:1 gather"),   # the same; freed when no tensor holds it after the step
              Alloc(3, 10, 8 * MIB, "a.py:1 f"),           # the first one's address comes back: it was freed
              Alloc(4, 12, 2 * MIB, "a.py:2 g")]           # alive after the step
    kept = replay(events, {}, other_held_b=None, alive_after={10, 11, 12})
    assert kept["step_gib"] == pytest.approx(11 * MIB / GIB) and kept["unseen_frees_gib"] == pytest.approx(4 * MIB / GIB)
    assert [s["site"] for s in kept["sites"]] == ["a.py:1 f", "a.py:2 g", "comm.py:1 gather"]
    dropped = replay(events, {}, other_held_b=None, alive_after={10})  # 11 and 12 dead after the step too
    assert dropped["step_gib"] == pytest.approx(8 * MIB / GIB)
    assert dropped["unseen_frees_gib"] == pytest.approx(7 * MIB / GIB)


def test_a_block_another_thread_frees_does_not_stay_live_in_the_replay():
    """The profiler records no free on a thread it does not follow (gloo's workers, NCCL's
    watchdog free what a collective held): a Python thread stands in for them here."""
    side = 512 + int(torch.randint(0, 64, (1,)))
    handed: list[torch.Tensor] = []

    def step():
        handed.append(torch.ones(side, side))           # a quarter of the next block
        worker = threading.Thread(target=handed.clear)  # the last reference goes on another thread
        worker.start()
        worker.join()
        big = torch.ones(2 * side, 2 * side)
        return big.sum()

    out = peak_breakdown(step, torch.device("cpu"), None, None, None)
    assert out["step_gib"] == pytest.approx(4 * side * side * 4 / GIB, rel=0.01), out  # the big block alone
    assert out["unseen_frees_gib"] == pytest.approx(side * side * 4 / GIB, rel=0.01)


def test_a_site_is_the_innermost_frame_of_the_models_own_code():
    compiled = [("op", "aten::mm"), ("py", "/tmp/torchinductor_root/ab/cabc.py(88): call"),
                ("py", "/venv/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py(600): _fn"),
                ("py", "/work/cpbench/cpbench/models/pairformer/modules/trunk.py(77): forward"),
                ("py", "/work/cpbench/cpbench/harness/worker.py(120): step")]
    assert site_of(compiled) == "cpbench/models/pairformer/modules/trunk.py forward"
    peer = [("py", "/venv/lib/python3.12/site-packages/boltz/distributed/model/layers/tri.py(12): ring")]
    assert site_of(peer) == "boltz/distributed/model/layers/tri.py ring"
    backward = [("op", "aten::empty_strided"), ("op", "autograd::engine::evaluate_function: MmBackward0")]
    assert site_of(backward) == "backward: MmBackward0"
    assert site_of([("op", "aten::empty"), ("py", "torch/nn/modules/linear.py(130): forward")]) == "aten::empty"
    assert site_of([]) == "(no frame)"


@dataclasses.dataclass
class _Batch:
    """A batch as an adapter may build one (Fold-CP's is a dataclass)."""

    x: torch.Tensor
    extra: dict


class _Owner:
    """An adapter-like owner of a model and its optimizer (``adapter._optimizer``)."""

    def __init__(self, model: torch.nn.Module):
        self._optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


@pytest.mark.parametrize("sites", ["function", "op"])
def test_a_cpu_step_under_the_profiler_charges_its_peak_to_the_function_that_allocated_it(sites):
    """By function (Python stacks) the site is ``big_mean``; by op (no stacks) the op that
    allocated it; the owners and the peak are the same either way."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    owner = _Owner(model)
    batch = _Batch(x=torch.randn(64, 256), extra={"mask": [torch.ones(64, dtype=torch.bool)]})
    side = 1024 + int(torch.randint(0, 256, (1,)))  # a fresh size each run: nothing cached stands in

    def big_mean(loss):
        big = torch.ones(side, side)
        return loss + big.mean()

    def step():
        loss = big_mean(model(batch.x).square().mean())
        loss.backward()
        owner._optimizer.step()
        owner._optimizer.zero_grad(set_to_none=False)

    step()  # AdamW's state and the gradients exist before the measured step, as after a warmup
    out = peak_breakdown(step, torch.device("cpu"), model, batch, owner, sites=sites)
    assert out["sites_by"] == sites
    param_b = sum(p.numel() * 4 for p in model.parameters())
    assert out["held_gib"]["parameters"] == pytest.approx(param_b / GIB, abs=1e-8)
    assert out["held_gib"]["gradients"] == pytest.approx(param_b / GIB, abs=1e-8)
    assert out["held_gib"]["optimizer_state"] >= 2 * param_b / GIB  # exp_avg and exp_avg_sq (+ steps)
    assert out["held_gib"]["inputs"] == pytest.approx((64 * 256 * 4 + 64) / GIB, abs=1e-8)  # nested in a dataclass
    top = out["sites"][0]
    if sites == "function":
        assert top["site"].endswith("test_memory_breakdown.py big_mean"), out["sites"]
    else:
        assert top["site"].startswith("aten::"), out["sites"]
    assert top["gib"] >= side * side * 4 / GIB
    assert out["peak_gib"] == pytest.approx(sum(out["held_gib"].values()) + out["step_gib"], rel=1e-4)


def test_the_record_keeps_the_rank_with_the_highest_peak():
    picked = peak_rank_breakdown([{"peak_gib": 1.0}, {"peak_gib": 2.0}, None, {"error": "E: x"}])
    assert picked == {"rank": 1, "peak_gib": 2.0}
    assert peak_rank_breakdown([{"error": "E: x"}, None]) == {"rank": 0, "error": "E: x"}


def test_memory_breakdown_must_be_a_boolean():
    assert compose_point("memory.breakdown=true", "routine=timing", "N=128").memory_breakdown is True
    with pytest.raises(ConfigError, match="memory.breakdown"):
        compose_point("memory.breakdown=sometimes", "routine=timing", "N=128")


def test_breakdown_sites_are_by_function_or_by_op():
    assert compose_point("routine=timing", "N=128").breakdown_sites == "function"
    assert compose_point("memory.breakdown_sites=op", "routine=timing", "N=128").breakdown_sites == "op"
    with pytest.raises(ConfigError, match="memory.breakdown_sites.*function, op"):
        compose_point("memory.breakdown_sites=line", "routine=timing", "N=128")


def _record(day: str, peak_gib: float, **breakdown) -> dict:
    point = {"workflow": "inference", "topology": "2d", "cp": 4, "mesh_shape": [2, 2], "emulated": True, "N": 2048,
             "dtype": "bf16", "device": "cuda", "model": {"name": "boltz2", "c_z": 128}}
    body = {"peak_gib": peak_gib, "held_gib": {"parameters": 0.5, "inputs": 0.01}, "step_gib": peak_gib - 0.51,
            "sites": [{"site": "cpbench/models/pairformer/layers/trimul.py forward", "gib": 1.0, "blocks": 3}]}
    return {"routine": "timing", "point": point, "env": {"date": day + "T00:00:00", "device": "cuda",
                                                         "gpu_model": "NVIDIA H200"},
            "memory_breakdown": {"rank": 0, **body, **breakdown}}


def test_the_report_shows_the_latest_breakdown_per_configuration_in_gib_and_z_shards():
    from cpbench.report.breakdown import breakdown_section

    text = breakdown_section([_record("2026-12-01", 9.0), _record("2026-12-07", 3.76), {"routine": "probe"}])
    rows = [line for line in text.splitlines() if line.startswith("| boltz2")]
    assert len(rows) == 1, text  # the later of the two records of one configuration
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[2] == "2d 2x2 cp=4 emulated" and cells[7] == "3.760"
    assert cells[8] == "15.04"  # 3.76 GiB over N²/4 · 128 bf16 elements (0.25 GiB)
    assert "`cpbench/models/pairformer/layers/trimul.py forward` 1.000 GiB (4.00 × z shard, 3 blocks)" in text
    assert "freed on a backend's own thread:" not in text  # no unseen frees in these records
    real = breakdown_section([_record("2026-12-07", 3.76, unseen_frees_gib=0.052)])
    assert "left out, freed on a backend's own thread: 0.052 GiB" in real
    failed = breakdown_section([{**_record("2026-12-07", 1.0), "memory_breakdown": {"rank": 0, "error": "E: x"}}])
    assert "no breakdown (E: x)" in failed
    assert breakdown_section([{"routine": "timing", "point": {"N": 8}}]) == ""
