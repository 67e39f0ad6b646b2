"""The probe's ``predict`` strategy, its verification re-runs and timeouts, over a rule runner.

The runner answers a point from a rule (no worker processes): its per-rank peak is a known
function of N and the point fits when that peak is at most the memory cap, so the exact max N
is known and both strategies can be held to it.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cpbench.config import ConfigError, _probe_settings
from cpbench.harness.runner import PointResult
from cpbench.harness.slots import Slots, SupervisorGroup
from cpbench.results import STATUSES
from cpbench.routines.probe import Probe

from helpers.run import compose_point

CAP_GIB = 80.0


def quadratic_gib(n: int) -> float:
    return 2e-7 * n * n + 1e-5 * n + 0.5


class RuleRunner:
    """Peak ``peak_gib(N)`` on both ranks; ``oom`` above ``cap_gib``. ``status_of(N, call)`` may
    override the verdict of the call-th run of N (1-based): ``timeout``, ``oom`` or ``ok``."""

    def __init__(self, peak_gib=quadratic_gib, status_of=None, cap_gib: float = CAP_GIB):
        self.peak_gib, self.status_of, self.cap_gib = peak_gib, status_of, cap_gib
        self.group = SupervisorGroup(Slots("local", 2, 0, 1, (0, 1), (0, 0)))
        self.calls: list[int] = []

    def run(self, task) -> PointResult:
        self.calls.append(task.N)
        peak = self.peak_gib(task.N)
        status = "ok" if peak <= self.cap_gib else "oom"
        if self.status_of is not None:
            status = self.status_of(task.N, self.calls.count(task.N)) or status
        if status != "ok":
            ranks = [{"rank": r, "status": status, "peak_alloc_gib": None} for r in (0, 1)]
            return PointResult(status, f"rank 1: {status} (rule)", ranks, 1.0)
        ranks = [{"rank": r, "status": "ok", "peak_alloc_gib": peak, "peak_reserved_gib": peak} for r in (0, 1)]
        return PointResult("ok", "", ranks, 1.0)


def probe_point(limit_gib: float = CAP_GIB, **probe):
    point = compose_point("device=cpu", "model=tiny", "cp=2")
    return replace(point, memory_limit_gib=limit_gib,
                   probe=replace(point.probe, **{"depth": None, "verify": False, "granularity": 64, **probe}))


def true_max_n(peak_gib=quadratic_gib, unit: int = 2) -> int:
    n = unit
    while peak_gib(n + unit) <= CAP_GIB:
        n += unit
    return n


def test_predict_finds_the_bisection_max_n_with_fewer_points():
    settings = dict(start=512, granularity=128)
    bisect_runner, predict_runner = RuleRunner(), RuleRunner()
    bisect = Probe(probe_point(strategy="bisect", **settings), bisect_runner, None, "sig").run()
    predict = Probe(probe_point(strategy="predict", **settings), predict_runner, None, "sig").run()
    exact = true_max_n()
    for out in (bisect, predict):
        assert out["status"] == "ok" and out["lower_bound"] is None
        assert 0 <= exact - out["max_n"] < 128 and out["first_fail_n"] - out["max_n"] <= 128
    assert abs(predict["max_n"] - bisect["max_n"]) <= 128
    assert len(predict_runner.calls) < len(bisect_runner.calls), (predict_runner.calls, bisect_runner.calls)
    assert predict_runner.calls[:3] == [512, 1024, 2048]  # the cheap points the fit is made of
    assert bisect["strategy"] == "bisect" and bisect["predicted_max_n"] is None and bisect["prediction"] is None
    assert predict["strategy"] == "predict" and abs(predict["predicted_max_n"] - exact) <= 2
    prediction = predict["prediction"]
    assert prediction["capacity_gib"] == CAP_GIB and prediction["capacity_source"] == "memory.limit_gib"
    assert (prediction["fit"]["n_min"], prediction["fit"]["n_max"], prediction["fit"]["n_points"]) == (512, 2048, 3)
    assert prediction["fit"]["a"] == pytest.approx(2e-7, rel=1e-3) and prediction["fallback"] is None
    error = (predict["predicted_max_n"] - predict["max_n"]) / predict["max_n"]
    assert prediction["error_at_max_n"] == pytest.approx(error, abs=1e-4)


def test_a_predict_probe_keeps_the_memory_it_predicted_against_in_its_state(tmp_path):
    """A probe stopped before its result.json still says what its peaks ran against
    (results.incomplete_probe turns a GPU's total into the record's env for the report)."""
    from cpbench.results.probe_state import _capacity_env

    state_path = tmp_path / "probe_state.json"
    Probe(probe_point(strategy="predict", start=512, granularity=128), RuleRunner(), state_path, "sig").run()
    state = json.loads(state_path.read_text())
    assert state["capacity"] == {"gib": CAP_GIB, "source": "memory.limit_gib"}
    assert _capacity_env(state["capacity"], state["point"]) == {}  # a cap is in the point already
    gpu = {"gib": 140.4, "source": "gpu_memory_gib"}
    assert _capacity_env(gpu, {"device": "cuda"}) == {"device": "cuda", "gpu_memory_gib": 140.4}


def test_a_stopped_probe_says_what_it_ran_on(tmp_path):
    """The state keeps the probe's hardware (NVML's GPU model on CUDA), so a probe stopped before
    its result.json is grouped with its own GPU's figures in the report."""
    from cpbench.report.rows import hardware_of
    from cpbench.results.probe_state import incomplete_probe

    state_path = tmp_path / "probe_state.json"
    point = probe_point(strategy="bisect", start=512, granularity=128)
    Probe(point, RuleRunner(), state_path, "sig").run()
    env = json.loads(state_path.read_text())["env"]
    assert env["device"] == point.device and env["date"]
    record = incomplete_probe(state_path)
    assert record["env"]["device"] == point.device
    assert hardware_of(record) == ("CPU" if point.device == "cpu" else env.get("gpu_model", point.device))


@pytest.mark.parametrize("peak_gib", [
    lambda n: 1e-7 * n * n + 0.5 if n <= 2048 else 8e-7 * n * n,    # the prediction is too high
    lambda n: 8e-7 * n * n if n <= 2048 else 1e-7 * n * n + 0.5,    # the prediction is too low
], ids=["lower-end-fails", "upper-end-fits"])
def test_predict_widens_a_bracket_whose_end_disagrees(peak_gib):
    runner = RuleRunner(peak_gib)
    out = Probe(probe_point(strategy="predict", start=512, granularity=128), runner, None, "sig").run()
    exact = true_max_n(peak_gib)
    assert out["status"] == "ok" and 0 <= exact - out["max_n"] < 128 and out["first_fail_n"] - out["max_n"] <= 128
    low, high = out["prediction"]["bracket"]
    assert not (low <= exact < high)  # the first bracket missed the max N, the widened one found it


def test_predict_falls_back_to_bisection_when_too_few_points_fit():
    runner = RuleRunner(lambda n: 1e-6 * n * n, cap_gib=0.3)  # 512 fits (0.26 GiB), 1024 does not
    out = Probe(probe_point(strategy="predict", start=256, granularity=64, limit_gib=0.3), runner, None, "sig")
    out = out.run()
    assert runner.calls[:3] == [256, 512, 1024]
    assert out["predicted_max_n"] is None and "N=1024 failed before 3 points fit" in out["prediction"]["fallback"]
    assert out["max_n"] == 512 and out["first_fail_n"] == 576 and out["status"] == "ok"  # bisected as usual


def test_verification_reruns_max_n_and_the_first_failing_n():
    runner = RuleRunner()
    out = Probe(probe_point(start=512, granularity=128, verify=True), runner, None, "sig").run()
    assert out["status"] == "ok"
    assert out["verify"]["max_n"]["N"] == out["max_n"] and out["verify"]["max_n"]["status"] == "ok"
    assert out["verify"]["above"]["N"] == out["first_fail_n"] and out["verify"]["above"]["status"] == "oom"
    assert runner.calls[-2:] == [out["max_n"], out["first_fail_n"]]


@pytest.mark.parametrize("flaky", ["max_n", "above"])
def test_a_point_that_fits_once_and_fails_once_makes_the_probe_unstable(flaky):
    exact = true_max_n()
    flip = exact if flaky == "max_n" else exact + 2  # bisect with granularity 2 ends on these two

    def status_of(n, call):
        if n == flip and call == 2:
            return "oom" if flaky == "max_n" else "ok"
        return None

    runner = RuleRunner(status_of=status_of)
    out = Probe(probe_point(strategy="predict", start=512, granularity=2, verify=True), runner, None, "sig").run()
    assert "unstable" in STATUSES
    assert (out["max_n"], out["first_fail_n"]) == (exact, exact + 2)
    assert out["status"] == "unstable" and out["lower_bound"] == "unstable"
    assert f"N={flip}" in out["message"]
    first, second = ("fit", "failed (oom") if flaky == "max_n" else ("failed (oom", "fit")
    head, tail = out["message"].split(" on its first run and ")
    assert head.startswith(f"N={flip} {first}") and tail.startswith(f"{second}"), out["message"]


def test_a_timed_out_point_is_never_the_first_failing_n():
    """Ramp 16, 32, 64 fit; 128 times out: the search stops, max N 64 is a lower bound."""
    runner = RuleRunner(lambda n: n / 1000, status_of=lambda n, call: "timeout" if n > 100 else None, cap_gib=1.0)
    out = Probe(probe_point(start=16, granularity=8, limit_gib=1.0), runner, None, "sig").run()
    assert runner.calls == [16, 32, 64, 128]
    assert out["max_n"] == 64 and out["first_fail_n"] is None and out["first_fail_status"] is None
    assert out["timed_out_n"] == [128] and out["status"] == "ok" and out["lower_bound"] == "timeout"
    assert "max_n is a lower bound: N=128 timed out" in out["message"]


def test_a_timeout_inside_the_bisection_ends_it_below_the_oom():
    """128 runs out of memory, 96 fits, 112 times out: 112 bounds nothing, the oom at 128 stays
    the first failing N, max N 96 is a lower bound."""
    runner = RuleRunner(lambda n: n / 1000, status_of=lambda n, call: "timeout" if 100 < n <= 120 else None,
                        cap_gib=0.125)
    out = Probe(probe_point(start=16, granularity=8, limit_gib=0.125), runner, None, "sig").run()
    assert runner.calls == [16, 32, 64, 128, 96, 112]
    assert out["max_n"] == 96 and out["first_fail_n"] == 128 and out["first_fail_status"] == "oom"
    assert out["timed_out_n"] == [112] and out["lower_bound"] == "timeout"


def test_a_probe_whose_first_point_times_out_has_status_timeout():
    runner = RuleRunner(status_of=lambda n, call: "timeout")
    out = Probe(probe_point(start=512, granularity=128, strategy="predict"), runner, None, "sig").run()
    assert out["max_n"] is None and out["first_fail_n"] is None and out["status"] == "timeout"
    assert out["timed_out_n"] == [512] and "N=512 timed out" in out["message"]


def test_restarted_predict_probe_replays_its_points(tmp_path):
    state = tmp_path / "probe_state.json"
    point = probe_point(strategy="predict", start=512, granularity=128)
    first = Probe(replace(point, probe=replace(point.probe, max_points=4)), RuleRunner(), state, "sig").run()
    assert "max_points=4" in first["message"]
    again_runner, fresh_runner = RuleRunner(), RuleRunner()
    again = Probe(point, again_runner, state, "sig").run()
    fresh = Probe(point, fresh_runner, None, "sig").run()
    assert again["max_n"] == fresh["max_n"] and again["predicted_max_n"] == fresh["predicted_max_n"]
    assert again_runner.calls == fresh_runner.calls[4:]  # the four measured points are not measured again


def test_probe_strategy_and_verify_resolve_per_device():
    base = {"start": 32, "granularity": 64, "growth": 2, "timeout_s": 60, "depth": "auto", "max_points": 32}
    for device, strategy, verify in (("cuda", "predict", True), ("cpu", "bisect", True)):
        settings = _probe_settings(base | {"strategy": "auto", "verify": "auto"}, device, 1, False, {})
        assert (settings.strategy, settings.verify) == (strategy, verify)
    settings = _probe_settings(base | {"strategy": "predict", "verify": False}, "cpu", 1, False, {})
    assert (settings.strategy, settings.verify) == ("predict", False)
    for key, value in (("strategy", "guess"), ("verify", "maybe")):
        with pytest.raises(ConfigError, match=f"probe.{key}"):
            _probe_settings(base | {key: value}, "cpu", 1, False, {})


def pair_gib(n: int) -> float:
    """The reference trunk's irreducible memory on one H200: pair tensors and constants (a·N²+c)."""
    return 2e-7 * n * n + 0.5


class LeanRuleRunner(RuleRunner):
    """Like the reference trunk: a normal step's chunk transients take a tenth of the device or
    40 % of what its irreducible memory ``pair_gib(N)`` leaves free, whichever is less (a peak a
    quadratic fit of small N extrapolates wrongly); a lean step (``task.lean``) peaks at the
    irreducible memory."""

    def __init__(self):
        super().__init__(peak_gib=pair_gib)
        self.lean_calls: list[int] = []

    def run(self, task) -> PointResult:
        result = super().run(task)
        if task.lean:
            self.lean_calls.append(task.N)
        elif result.status == "ok":
            peak = pair_gib(task.N) + min(0.1 * self.cap_gib, 0.4 * (self.cap_gib - pair_gib(task.N)))
            result.ranks = [r | {"peak_alloc_gib": peak, "peak_reserved_gib": peak} for r in result.ranks]
        return result


def test_predict_fits_lean_points_and_brackets_the_max_n_in_two_points():
    settings = dict(start=512, granularity=128)
    runner = LeanRuleRunner()
    out = Probe(probe_point(strategy="predict", **settings), runner, None, "sig", lean_fit=True).run()
    exact = true_max_n(pair_gib)
    assert runner.lean_calls == [512, 1024, 2048] and [p["lean"] for p in out["points"][:3]] == [True] * 3
    assert all(not p["lean"] for p in out["points"][3:])
    assert out["status"] == "ok" and 0 <= exact - out["max_n"] < 128 and out["first_fail_n"] - out["max_n"] <= 128
    assert len(runner.calls) == 5, runner.calls  # three lean points, then the bracket's two ends
    assert abs(out["predicted_max_n"] - exact) <= 2 and out["prediction"]["fit"]["max_rel_residual"] < 1e-6
    # without lean points the same probe fits the free-memory-driven peaks and misses the max N
    blind = Probe(probe_point(strategy="predict", **settings), LeanRuleRunner(), None, "sig").run()
    # normal steps' transients hide the N² term: no prediction (a fallback), or a wrong one
    assert blind["points"][0]["lean"] is False
    assert blind["predicted_max_n"] is None or abs(blind["predicted_max_n"] - exact) > 128
    assert abs(blind["max_n"] - out["max_n"]) <= 128  # the search still ends within a granularity step


def test_the_depth_check_runs_normal_steps_before_the_lean_fitting_point():
    runner = LeanRuleRunner()
    point = probe_point(strategy="predict", start=512, granularity=128)
    point = replace(point, probe=replace(point.probe, depth=2))
    out = Probe(point, runner, None, "sig", lean_fit=True).run()
    assert out["depth_verified"] is True and out["depth"] == 2
    assert runner.calls[:3] == [512, 512, 512] and runner.lean_calls[:3] == [512, 1024, 2048]
    assert out["points"][0]["lean"] is True and out["status"] == "ok"


def test_a_fit_with_as_many_terms_as_points_never_gets_the_tight_bracket():
    """Three points through a·N²+b·N+c fit exactly whatever the peaks are (on a CPU, resident-set
    peaks at small N are mostly a baseline): the tight one-granularity bracket needs a fit with
    more points than terms and a small residual."""
    from cpbench.results.memory_fit import MemoryFit
    from cpbench.routines.probe_predict import bracket_ends

    exact = MemoryFit(3.6e-8, 3.2e-5, 0.032, 1, "a·N²+b·N+c", 3, 0.0)
    over = MemoryFit(4.8e-7, 0.0, 1.43, 1, "a·N²+c", 3, 0.038)
    loose, tight = bracket_ends(1211, 64, 1, exact), bracket_ends(16983, 512, 1, over)
    assert loose[1] - loose[0] >= 2 * 64 and loose[0] < 1211 < loose[1]
    # bisection's first midpoint is half a step above the prediction, not the predicted edge itself
    assert (loose[0] + loose[1]) // 2 - 1211 == 64 // 2
    assert tight[1] - tight[0] == 512 and tight[0] < 16983 < tight[1]


def test_a_fit_whose_n_squared_term_is_a_small_share_is_not_extrapolated():
    """Peaks that grow linearly over the cheap points (a 2x2 grid on one H200: 1.51, 2.02, 3.17 GiB
    at N=1,024-4,096) fitted b·N+c and predicted 251,944 where 33,354 ran out of memory: such a
    fit says nothing of the N² term, so the probe bisects instead."""
    from cpbench.routines.probe_predict import predict_max_n

    for peaks in ((1.510, 2.025, 3.167), (1.521, 2.146, 3.182)):  # allocated; reserved (concave: b·N+c)
        points = [{"N": n, "fits": True, "peak_alloc_gib": [p], "peak_reserved_gib": [p]}
                  for n, p in zip((1024, 2048, 4096), peaks)]
        prediction = predict_max_n(points, (135.9, "gpu_memory_gib"), cp=4, unit=2)
        assert prediction.predicted_max_n is None and "N² term" in prediction.fallback, prediction
    quadratic = [{"N": n, "fits": True, "peak_alloc_gib": [p], "peak_reserved_gib": [p]}
                 for n, p in ((1024, 1.77), (2048, 2.57), (4096, 5.68))]
    assert predict_max_n(quadratic, (135.9, "gpu_memory_gib"), cp=2, unit=2).predicted_max_n > 4096


def test_a_floor_saves_the_halving_after_a_first_point_just_over_the_limit():
    """probe.floor: the first point fails, the floor is measured next and the bracket is done;
    without it the bisection halves down from the same failure."""
    exact = true_max_n()
    settings = dict(strategy="bisect", start=exact + 2, granularity=512)
    with_floor, without = RuleRunner(), RuleRunner()
    out = Probe(probe_point(floor=exact - 300, **settings), with_floor, None, "sig").run()
    plain = Probe(probe_point(**settings), without, None, "sig").run()
    assert with_floor.calls == [exact + 2, exact - 300]
    assert (out["max_n"], out["first_fail_n"]) == (exact - 300, exact + 2) and out["lower_bound"] is None
    assert plain["first_fail_n"] == exact + 2 and len(without.calls) > 3 and without.calls[1] < exact // 2 + 2


def test_a_floor_that_fails_is_a_failure_like_any_other():
    exact = true_max_n()
    runner = RuleRunner()
    out = Probe(probe_point(strategy="bisect", start=exact + 1000, granularity=128, floor=exact + 500), runner,
                None, "sig").run()
    assert runner.calls[:2] == [exact + 1000, exact + 500]
    assert 0 <= exact - out["max_n"] < 128 and out["first_fail_n"] - out["max_n"] <= 128


def test_a_floor_is_below_the_start_and_not_part_of_the_state_identity():
    from cpbench.job import probe_state_signature

    base = {"start": 1024, "granularity": 64, "growth": 2, "timeout_s": 60, "depth": "auto", "max_points": 32}
    assert _probe_settings(base | {"floor": 999}, "cpu", 4, False, {}).floor == 996  # a multiple of the unit
    assert _probe_settings(base, "cpu", 4, False, {}).floor is None
    for floor in (1024, 2048, 0, "low"):
        with pytest.raises(ConfigError, match="probe.floor"):
            _probe_settings(base | {"floor": floor}, "cpu", 4, False, {})
    config = {"cp": 2, "probe": {"start": 1024, "floor": None}}
    assert probe_state_signature(config) == probe_state_signature(config | {"probe": {"start": 1024, "floor": 512}})
    assert probe_state_signature(config) != probe_state_signature(config | {"probe": {"start": 2048, "floor": None}})
