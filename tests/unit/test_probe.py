"""The probe's search (ramp, bisection, cap, depth check, saved state) over a scripted runner.

Real worker processes are exercised in test_faults.py and test_probe_memory.py; here the
runner answers from a rule, so the search itself is specified exactly and quickly.
"""

from __future__ import annotations

import time
from dataclasses import replace

from cpbench.harness.runner import PointResult
from cpbench.harness.slots import Slots, SupervisorGroup
from cpbench.results import read_json
from cpbench.routines.probe import Probe

from helpers.run import compose_point


class ScriptedRunner:
    """Answers a point from ``fits(n, run_blocks)``; peak = n/1000 GiB (+ ``extra_gib`` at full depth)."""

    def __init__(self, max_fit_n: int, full_depth_extra_gib: float = 0.0):
        self.max_fit_n, self.extra = max_fit_n, full_depth_extra_gib
        self.group = SupervisorGroup(Slots("local", 2, 0, 1, (0, 1), (0, 0)))
        self.calls: list[tuple[int, int | None]] = []

    def run(self, task) -> PointResult:
        self.calls.append((task.N, task.run_blocks))
        if task.N > self.max_fit_n:
            ranks = [{"rank": r, "status": "oom", "message": "out of memory", "peak_alloc_gib": None} for r in (0, 1)]
            return PointResult("oom", "rank 1: out of memory", ranks, 1.0)
        peak = task.N / 1000 + (self.extra if task.run_blocks is None else 0.0)
        ranks = [{"rank": r, "status": "ok", "peak_alloc_gib": peak, "peak_reserved_gib": peak} for r in (0, 1)]
        return PointResult("ok", "", ranks, 1.0)


def probe_point(**probe):
    """A CPU probe point; the search alone (``probe.verify`` is specified in test_probe_strategy),
    bisected to 64 tokens (the searches below are written for it, not for the CPU default)."""
    point = compose_point("device=cpu", "model=tiny", "cp=2")
    return replace(point, probe=replace(point.probe, **{"verify": False, "granularity": 64, **probe}))


def test_probe_ramps_then_bisects_to_the_granularity():
    runner = ScriptedRunner(max_fit_n=100)
    out = Probe(probe_point(start=16, granularity=8, depth=None), runner, None, "sig").run()
    assert [n for n, _ in runner.calls] == [16, 32, 64, 128, 96, 112, 104]
    assert out["max_n"] == 96 and out["first_fail_n"] == 104 and out["first_fail_status"] == "oom"
    assert out["status"] == "ok" and [p["fits"] for p in out["points"]] == [True] * 3 + [False, True, False, False]
    assert out["peak_alloc_gib_per_rank"] == [0.096, 0.096]


def test_probe_n_values_are_multiples_of_the_padding_unit():
    point = compose_point("device=cpu", "model=tiny", "topology=2d", "cp=6", "topology.cp0=3")  # unit lcm(3,2)=6
    point = replace(point, probe=replace(point.probe, start=6, granularity=6, depth=None, verify=False))
    runner = ScriptedRunner(max_fit_n=50)
    out = Probe(point, runner, None, "sig").run()
    assert all(n % 6 == 0 for n, _ in runner.calls)
    assert out["max_n"] == 48 and out["first_fail_n"] == 54


def test_probe_stops_at_max_points_and_says_so():
    runner = ScriptedRunner(max_fit_n=10**9)
    out = Probe(probe_point(start=16, granularity=16, depth=None, max_points=3), runner, None, "sig").run()
    assert len(runner.calls) == 3 and out["max_n"] == 64 and out["first_fail_n"] is None
    assert "max_points=3" in out["message"] and "lower bound" in out["message"]  # no N failed yet


def test_probe_capped_inside_the_bisection_says_the_gap_is_open():
    runner = ScriptedRunner(max_fit_n=40)  # 16, 32 fit, 64 fails, then 48 would be tried
    out = Probe(probe_point(start=16, granularity=8, depth=None, max_points=3), runner, None, "sig").run()
    assert out["max_n"] == 32 and out["first_fail_n"] == 64
    assert "before the bisection reached probe.granularity" in out["message"]


def test_probe_starts_no_point_after_its_time_budget_and_says_so():
    """probe.budget_s: the point running when the budget is spent finishes, no new one starts,
    and the probe still returns its record (a job's time limit does not lose the verdict)."""

    class SlowRunner(ScriptedRunner):
        def run(self, task) -> PointResult:
            time.sleep(0.3)
            return super().run(task)

    runner = SlowRunner(max_fit_n=100)
    out = Probe(probe_point(start=16, granularity=8, depth=None, budget_s=0.5), runner, None, "sig").run()
    assert [n for n, _ in runner.calls] == [16, 32]  # 32 started at ~0.3 s, 64 would have at ~0.6 s
    assert out["status"] == "ok" and out["max_n"] == 32 and "probe.budget_s=0.5" in out["message"]


def test_probe_where_nothing_fits_reports_the_failure():
    out = Probe(probe_point(start=64, granularity=16, depth=None), ScriptedRunner(max_fit_n=8), None, "sig").run()
    assert out["max_n"] is None and out["status"] == "oom" and out["first_fail_n"] == 16


def test_probe_depth_is_verified_at_the_first_point():
    runner = ScriptedRunner(max_fit_n=40)
    out = Probe(probe_point(start=16, granularity=8, depth=2), runner, None, "sig").run()
    assert runner.calls[:2] == [(16, None), (16, 2)]  # full then shortened, once
    assert all(blocks == 2 for _, blocks in runner.calls[2:])
    assert out["depth"] == 2 and out["depth_verified"] is True


def test_probe_falls_back_to_full_depth_when_the_short_peak_differs():
    runner = ScriptedRunner(max_fit_n=40, full_depth_extra_gib=0.5)
    out = Probe(probe_point(start=16, granularity=8, depth=2), runner, None, "sig").run()
    assert out["depth_verified"] is False and out["depth"] == 2  # tiny's block count: the full trunk
    assert all(blocks is None for _, blocks in runner.calls[2:])


def test_a_cuda_depth_check_accepts_a_weights_sized_difference_and_not_a_pair_tensor():
    """On CUDA a full step may hold up to DEPTH_FLOOR_GIB more than the shortened one (the stock
    Boltz-2 trunk's bf16 weight copies: 0.06 GiB, 2.9 % at N=512), not a pair tensor more."""
    for extra_gib, verified in ((0.06, True), (0.5, False)):
        point = probe_point(start=16, granularity=8, depth=2)
        out = Probe(replace(point, device="cuda"), ScriptedRunner(max_fit_n=40, full_depth_extra_gib=extra_gib),
                    None, "sig").run()
        assert out["depth_verified"] is verified, extra_gib


def test_probe_checks_depth_at_depth_check_n_and_searches_from_there():
    """probe.depth_check_n: the all-block step runs at a small N, not at a large probe.start;
    that point fits, so the bisection between it and a failing start needs no ramp below start."""
    runner = ScriptedRunner(max_fit_n=100)
    out = Probe(probe_point(start=128, granularity=8, depth=2, depth_check_n=16), runner, None, "sig").run()
    assert runner.calls[:3] == [(16, None), (16, 2), (128, 2)], runner.calls
    assert [n for n, _ in runner.calls[3:]] == [72, 100, 114, 106], runner.calls  # bisection of (16, 128)
    assert out["max_n"] == 100 and out["first_fail_n"] == 106 and out["depth_verified"] is True


def test_restarted_probe_keeps_its_depth_check_point_as_the_lower_end(tmp_path):
    state = tmp_path / "probe_state.json"
    settings = dict(start=128, granularity=8, depth=2, depth_check_n=16)
    Probe(probe_point(max_points=3, **settings), ScriptedRunner(max_fit_n=100), state, "sig").run()
    again = ScriptedRunner(max_fit_n=100)
    out = Probe(probe_point(**settings), again, state, "sig").run()
    assert again.calls == [(100, 2), (114, 2), (106, 2)], again.calls  # 16, 128 and 72 replayed
    assert out["max_n"] == 100 and out["first_fail_n"] == 106


def test_probe_whose_depth_check_point_fails_bisects_below_it_and_skips_the_ramp():
    runner = ScriptedRunner(max_fit_n=8)
    out = Probe(probe_point(start=64, granularity=8, depth=2, depth_check_n=16), runner, None, "sig").run()
    assert runner.calls == [(16, None), (16, 2), (8, None)], runner.calls  # start=64 never ran; full depth after the failed check
    assert out["max_n"] == 8 and out["first_fail_n"] == 16 and out["depth_verified"] is False


def test_restarted_probe_continues_from_its_saved_state(tmp_path):
    state = tmp_path / "probe_state.json"
    first = ScriptedRunner(max_fit_n=100)
    probe = Probe(probe_point(start=16, granularity=8, depth=None, max_points=4), first, state, "sig")
    probe.run()  # killed after 4 points, as a SLURM requeue would
    assert len(read_json(state)["points"]) == 4
    again = ScriptedRunner(max_fit_n=100)
    out = Probe(probe_point(start=16, granularity=8, depth=None), again, state, "sig").run()
    assert [n for n, _ in again.calls] == [96, 112, 104]  # only the points not measured before
    assert out["max_n"] == 96 and len(out["points"]) == 7
    fresh = ScriptedRunner(max_fit_n=100)
    Probe(probe_point(start=16, granularity=8, depth=None), fresh, state, "other-signature").run()
    assert len(fresh.calls) == 7  # a different point never reuses the state
