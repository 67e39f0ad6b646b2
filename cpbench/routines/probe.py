"""The max-N probe: ramp from ``probe.start`` ×``growth`` until a point fails, then bisect.

Every N tried is a multiple of the padding unit; the bisection stops when the gap between
the largest fitting N and the smallest failing N is at most ``probe.granularity``. A point
fits when every rank completed one full step (status ``ok``); ``oom`` and ``error`` count as
not fitting and the search goes on. A ``timeout`` is not a memory limit: the search stops
there, that N never becomes ``first_fail_n``, and ``max_n`` is a lower bound (``timed_out_n``).

Strategy (``probe.strategy``): ``bisect`` is the above. ``predict`` ramps only until
``PREDICT_POINTS`` points fit, fits their per-rank peak (``results.memory_fit``), predicts the
N where it meets the per-rank memory (``routines.probe_predict``), measures the ends of a
bracket around it (the lower end must fit, the upper end fail; an end that disagrees moves
out by twice the last step) and bisects inside; without a usable prediction it goes on as
``bisect``. When the adapter's ``run_step`` takes ``lean``, the ramp's points run lean (the
adapter's irreducible memory: a peak that does not depend on how much memory is free, so the
fit extrapolates); they are marked ``"lean": true`` and the report's memory model fits them.

Floor (``probe.floor``): an N expected to fit, such as an earlier probe's max N. When a point
fails and no N at or above the floor has fitted, the bisection measures the floor first instead
of halving down towards the largest fitting N (near a 130 GiB limit, where a step takes minutes,
a first point just over the limit would otherwise cost a dozen points). It is measured like any
other point, never assumed.

Verification (``probe.verify``): after the search, ``max_n`` and ``first_fail_n`` run once more;
a point that fits once and fails once makes the probe's status ``unstable``.

Depth (``probe.depth``): an inference step's peak does not grow with the number of blocks
run, its time does; so when the adapter takes ``run_blocks`` the probe runs only that many
blocks. At the first point it checks the claim: the shortened step's peak must match the
full step's within ``DEPTH_TOLERANCE`` (else it falls back to full depth). ``probe.depth_check_n``
moves the check to a smaller N than ``probe.start`` (all blocks at a large N take minutes);
that point is measured like any other, and when it fits it is the lower end of the search.

State (``probe_state.json``, written atomically after every point) holds every measured
point; a restarted job with the same signature replays it and measures only what is new. The
state's signature leaves out the probe's limits (``probe.budget_s``, ``probe.max_points``:
``cpbench.job.PROBE_LIMIT_KEYS``), so a probe that one limit stopped continues under a larger one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

from cpbench.config import Point
from cpbench.harness.env import env_metadata
from cpbench.harness.memory import MEASURE_CPU, MEASURE_CUDA
from cpbench.harness.runner import PointRun, Runner
from cpbench.models.api import load_adapter, supports_lean, supports_run_blocks
from cpbench.results import max_over_ranks, read_json, write_json_atomic
from cpbench.routines.probe_predict import PREDICT_POINTS, Prediction, bracket_ends, memory_capacity_gib, predict_max_n

log = logging.getLogger("cpbench")

DEPTH_TOLERANCE = 0.01
# The depth check also accepts an absolute difference this small. CPU peaks are resident-set
# sizes: page and malloc-arena granularity make a few MiB of noise. On CUDA, what the shortened
# step may lack without growing with N is weights-sized: the stock Boltz-2 trunk keeps autocast's
# bf16 weight copies for every block it ran (about 1 MiB a block, 0.06 GiB over 64), which at
# the first point (N=512-1,024) is 1-3 % of the peak and near the limit 0.05 % (a few tokens).
DEPTH_FLOOR_GIB = {"cpu": 16 / 1024, "cuda": 0.125}


class _PointCap(Exception):
    """probe.max_points reached, or probe.budget_s spent (the message says which)."""


STATE_ENV_KEYS = ("date", "device", "gpu_model", "gpu_memory_gib")  # the state's env: what a report groups by


class _TimedOut(Exception):
    """A point timed out: its N bounds nothing, the search stops (``args[0]`` is the N)."""


class Probe:
    """One probe over a runner; ``run()`` returns the probe fields of the result record."""

    def __init__(self, point: Point, runner: Runner, state_path: Path | None, signature: str,
                 lean_fit: bool = False):
        self.point, self.runner, self.state_path, self.signature = point, runner, state_path, signature
        self.settings = point.probe
        # the ramp's fitting points run lean (``run_step(..., lean=True)``) for the predict strategy
        self.lean_fit = lean_fit and self.settings.strategy == "predict"
        state = self._load_state()
        self.points: dict[int, dict] = {p["N"]: p for p in state.get("points", [])}
        self.depth: int | None = state.get("depth", self.settings.depth)
        self.depth_verified: bool | None = state.get("depth_verified")
        self.depth_checked: bool = state.get("depth_checked", False)
        self.verified: dict[str, dict] = state.get("verify") or {}  # re-runs of max_n / first_fail_n
        self.started_s, self.cap = time.monotonic(), ""
        self.lo: int | None = None   # largest N measured to fit (below hi)
        self.hi: int | None = None   # smallest N measured not to fit (never a timeout)
        self.timed_out_n: list[int] = []
        self.visited: list[int] = []  # N this search asked about, in order (replayed or measured)
        self.prediction: Prediction | None = None
        self.env = {k: v for k, v in env_metadata(point.device).items() if k in STATE_ENV_KEYS}

    # ------------------------------------------------------------ state
    def _load_state(self) -> dict:
        state = {}
        if self.state_path is not None and self.state_path.exists():
            try:
                state = read_json(self.state_path)
            except (OSError, ValueError):
                state = {}
            if state.get("signature") != self.signature:
                state = {}
            elif state.get("points"):
                log.info("probe: continuing from %s (%d points measured)", self.state_path, len(state["points"]))
        # Every supervisor must replay the same points: supervisor 0's state wins.
        return self.runner.group.broadcast(state)

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        p = self.prediction
        write_json_atomic(self.state_path, {
            "signature": self.signature, "depth": self.depth, "depth_verified": self.depth_verified,
            "depth_checked": self.depth_checked, "points": self.ordered_points(), "verify": self.verified,
            # what a report needs of a probe stopped before its result.json (results.incomplete_probe):
            # its point, the granularity it bisected to, the memory its peaks ran against (known
            # once the predict strategy asked), and what it ran on (NVML: no CUDA context here)
            "point": self.point.record(), "granularity": self.settings.granularity, "env": self.env,
            "capacity": {"gib": p.capacity_gib, "source": p.capacity_source} if p and p.capacity_gib else None})

    def ordered_points(self) -> list[dict]:
        return sorted(self.points.values(), key=lambda p: p["order"])

    # ------------------------------------------------------------ measuring
    def _run(self, n: int, run_blocks: int | None, lean: bool = False):
        p = self.point
        return self.runner.run(PointRun(N=n, n_atoms=p.atoms_per_token * n, S=p.S,
                                        timeout_s=self.settings.timeout_s, run_blocks=run_blocks, lean=lean))

    def _check_depth(self, n: int):
        """First point: run full and shortened steps, keep the shortened depth if peaks agree.

        Always with the normal chunk budget: the claim is about the steps the search runs (on
        one H200 a lean full-depth step at N=1,024 peaked 1.5 % above its lean 1-block step,
        1.95 against 1.92 GiB, where the normal steps agree exactly at 512, 1,024 and 2,048)."""
        full = self._run(n, None)
        short = self._run(n, self.depth)
        full_peak, short_peak = max_over_ranks(full.per_rank("peak_alloc_gib")), max_over_ranks(short.per_rank("peak_alloc_gib"))
        floor = DEPTH_FLOOR_GIB.get(self.point.device, 0.0)
        agree = (full.status == short.status == "ok" and full_peak is not None and short_peak is not None
                 and abs(short_peak - full_peak) <= max(DEPTH_TOLERANCE * full_peak, floor))
        self.depth_checked = True
        self.depth_verified = agree
        log.info("probe depth check at N=%d: full peak %s GiB, %s blocks peak %s GiB -> %s", n,
                 _fmt(full_peak), self.depth, _fmt(short_peak),
                 "verified" if agree else "falling back to full depth")
        if agree:
            return short
        self.depth = None
        return full

    def _check_budget(self) -> None:
        budget_s = self.settings.budget_s
        # supervisor 0's clock decides, so that every supervisor stops before the same point
        if budget_s is not None and self.runner.group.broadcast(time.monotonic() - self.started_s >= budget_s):
            raise _PointCap(f"probe.budget_s={budget_s:g}")

    def fits(self, n: int, lean: bool = False) -> bool:
        """Whether ``n`` fits (measured now, lean or not, or replayed from the state); raises
        ``_TimedOut`` for a point that timed out and ``_PointCap`` when no new point may start."""
        if n not in self.points:
            self._measure(n, lean)
        if self.points[n]["status"] == "timeout":
            raise _TimedOut(n)
        return self.points[n]["fits"]

    def _measure(self, n: int, lean: bool = False) -> None:
        if len(self.points) >= self.settings.max_points:
            raise _PointCap(f"probe.max_points={self.settings.max_points}")
        self._check_budget()
        if self.depth is not None and not self.depth_checked:
            result = self._check_depth(n)
            if lean:  # the fitting point itself: the (checked) depth, lean
                result = self._run(n, self.depth, lean)
        else:
            result = self._run(n, self.depth, lean)
        record = {
            "N": n, "fits": result.status == "ok", "status": result.status, "message": result.message, "lean": lean,
            "peak_alloc_gib": result.per_rank("peak_alloc_gib"),
            "peak_reserved_gib": result.per_rank("peak_reserved_gib"),
            "seconds": round(result.seconds, 3), **_step_seconds(result), "order": len(self.points),
        }
        self.points[n] = record
        self._save_state()
        peak = max_over_ranks(record["peak_alloc_gib"])
        step = (f" (step {record['step_s']:.1f} s, compile {record['compile_s']:.1f} s)"
                if record.get("step_s") is not None else "")
        log.info("probe N=%d%s %s peak=%s GiB %.1f s%s%s", n, " (lean)" if lean else "",
                 "fits" if record["fits"] else result.status, _fmt(peak), result.seconds, step,
                 "" if record["fits"] else f" ({result.message[:200]})")

    def _try(self, n: int, lean: bool = False) -> bool:
        """``fits(n)``, moving the search's bounds (``lo``, ``hi``) with the answer."""
        if n not in self.visited:
            self.visited.append(n)
        if self.fits(n, lean):
            self.lo = n if self.lo is None else max(self.lo, n)
            return True
        self.hi = n if self.hi is None else min(self.hi, n)
        return False

    # ------------------------------------------------------------ search
    def search(self) -> tuple[int | None, int | None, bool]:
        """Ramp (and predict), then bisect; returns (largest fitting N, smallest failing N, capped).

        A timed-out point ends the search (``timed_out_n``); the bounds found so far stand."""
        s = self.settings
        try:
            check_n = s.depth_check_n  # <= start (config); a bound of the search either way
            if check_n is not None and (check_n in self.points or (self.depth is not None and not self.depth_checked)):
                self._try(check_n)
            if s.strategy == "predict":
                self._ramp(until_fitting=PREDICT_POINTS, lean=self.lean_fit)
                self._predict_and_bracket()
            self._ramp()
            self._bisect()
        except _PointCap as cap:
            self.cap = str(cap)
            return self.lo, self.hi, True
        except _TimedOut as timed_out:
            self.timed_out_n.append(timed_out.args[0])
        return self.lo, self.hi, False

    def _ramp(self, until_fitting: int | None = None, lean: bool = False) -> None:
        """Grow N from ``probe.start`` until a point fails (or ``until_fitting`` points fit,
        measured ``lean`` when asked)."""
        s, unit = self.settings, self.point.padding_unit
        n = s.start
        while self.hi is None:
            if until_fitting is not None and len(self._visited_fits(lean)) >= until_fitting:
                return
            if self._try(n, lean):
                n = max(n + unit, -(-int(n * s.growth) // unit) * unit)

    def _visited_fits(self, lean: bool = False) -> list[dict]:
        """The visited points that fit (only the lean ones when ``lean``)."""
        return [self.points[n] for n in self.visited
                if self.points[n]["fits"] and (not lean or self.points[n].get("lean"))]

    def _bisect(self) -> None:
        s, unit = self.settings, self.point.padding_unit
        # probe.floor: an N expected to fit, tried before halving down from a failure near the limit
        if s.floor is not None and (self.lo or 0) < s.floor < self.hi:
            self._try(s.floor)
        while self.hi - (self.lo or 0) > s.granularity:
            low = self.lo or 0
            mid = (low + self.hi) // 2 // unit * unit
            if mid <= low or mid < unit:
                break
            self._try(mid)

    def _predict_and_bracket(self) -> None:
        """Predict the max N from the points that fit, then measure a bracket around it: its lower
        end must fit and its upper end fail; an end that disagrees moves out by twice the last
        step (the bracket's width doubles) until one agrees. Leaves the bisection to ``search``."""
        if self.hi is not None:
            self.prediction = Prediction(fallback=f"N={self.hi} failed before {PREDICT_POINTS} points fit")
            return
        capacity = memory_capacity_gib(self.point, self.runner.group.broadcast)
        unit = self.point.padding_unit
        # only the points this search visited: a restart replays the same prediction
        fitted = self._visited_fits(self.lean_fit)
        self.prediction = prediction = predict_max_n(fitted, capacity, self.point.cp, unit)
        if prediction.predicted_max_n is None:
            log.info("probe: no prediction (%s); bisecting", prediction.fallback)
            return
        low, high = bracket_ends(prediction.predicted_max_n, self.settings.granularity, unit, prediction.fit)
        self.prediction = prediction = replace(prediction, bracket=(low, high))
        log.info("probe: predicted max N %d (%s at %.4g GiB from %s); bracket %d..%d", prediction.predicted_max_n,
                 prediction.fit.describe(), prediction.capacity_gib, prediction.capacity_source, low, high)
        # each end that disagrees moves out by twice the last step (never less than one unit)
        step, n = max(unit, prediction.predicted_max_n - low), low
        while n > self.lo and not self._try(n):  # the lower end must fit
            step *= 2
            n = max(unit, (self.hi - step) // unit * unit)
        step, n = max(unit, high - prediction.predicted_max_n), max(high, self.lo + unit)
        while self.hi is None and self._try(n):  # the upper end must fail
            step *= 2
            n = -(-(self.lo + step) // unit) * unit

    # ------------------------------------------------------------ verification
    def verify(self, max_n: int | None, first_fail_n: int | None) -> dict:
        """Run ``max_n`` and ``first_fail_n`` once more (replayed from the state on a restart):
        ``{"max_n": {N, status, fits, ...} | None, "above": ... | None}``; an entry is None
        when there is no such N or ``probe.budget_s`` was spent (then ``skipped`` says so)."""
        out: dict = {"max_n": None, "above": None}
        for key, n in (("max_n", max_n), ("above", first_fail_n)):
            if n is None:
                continue
            if key not in self.verified or self.verified[key]["N"] != n:
                try:
                    self._check_budget()
                except _PointCap as cap:
                    out["skipped"] = f"stopped at {cap}"
                    break
                result = self._run(n, self.depth)
                self.verified[key] = {
                    "N": n, "fits": result.status == "ok", "status": result.status, "message": result.message,
                    "peak_alloc_gib": result.per_rank("peak_alloc_gib"),
                    "peak_reserved_gib": result.per_rank("peak_reserved_gib"), "seconds": round(result.seconds, 3)}
                self._save_state()
                log.info("probe verify N=%d: %s", n, result.status)
            out[key] = self.verified[key]
        return out

    def _unstable(self, verify: dict) -> str | None:
        """The message of a point that fit once and failed once (a timeout decides nothing)."""
        for key in ("max_n", "above"):
            again = verify.get(key)
            if again is None or again["status"] == "timeout":
                continue
            first = self.points[again["N"]]
            if first["fits"] != again["fits"]:
                outcomes = [("fit" if p["fits"] else f"failed ({p['status']}: {(p.get('message') or '')[:160]})")
                            for p in (first, again)]
                return (f"N={again['N']} {outcomes[0]} on its first run and {outcomes[1]} on its second: "
                        "max_n is not a reproducible limit")
        return None

    # ------------------------------------------------------------ record
    def run(self) -> dict:
        max_n, first_fail_n, capped = self.search()
        verify = self.verify(max_n, first_fail_n) if self.settings.verify and max_n is not None else None
        points = self.ordered_points()
        fail = self.points.get(first_fail_n) if first_fail_n is not None else None
        at_max = self.points.get(max_n) if max_n is not None else None
        blocks = self.point.model.get("blocks")
        prediction = self.prediction if self.settings.strategy == "predict" else None
        out = {
            "max_n": max_n, "first_fail_n": first_fail_n,
            "first_fail_status": fail["status"] if fail else None,
            "first_fail_message": fail["message"] if fail else None,
            "strategy": self.settings.strategy,
            "predicted_max_n": prediction.predicted_max_n if prediction else None,
            "prediction": prediction.record(max_n) if prediction else None,
            "verify": verify, "timed_out_n": list(self.timed_out_n),
            "depth": self.depth if self.depth is not None else (blocks if isinstance(blocks, int) else None),
            "depth_verified": self.depth_verified,
            "points": [{k: v for k, v in p.items() if k != "order"} for p in points],
            "peak_alloc_gib": max_over_ranks(at_max["peak_alloc_gib"]) if at_max else None,
            "peak_reserved_gib": max_over_ranks(at_max["peak_reserved_gib"]) if at_max else None,
            "peak_alloc_gib_per_rank": at_max["peak_alloc_gib"] if at_max else None,
            "peak_reserved_gib_per_rank": at_max["peak_reserved_gib"] if at_max else None,
            "memory_measure": MEASURE_CUDA if self.point.device == "cuda" else MEASURE_CPU,
        }
        out.update(self._verdict(max_n, first_fail_n, capped, fail, verify))
        return out

    def _verdict(self, max_n, first_fail_n, capped, fail, verify) -> dict:
        """``status``, ``message`` and ``lower_bound`` (why max_n only bounds the max N from below)."""
        timed_out = (f"N={', '.join(map(str, self.timed_out_n))} timed out (probe.timeout_s={self.settings.timeout_s:g})"
                     if self.timed_out_n else "")
        if max_n is None:
            smallest = min(self.points) if self.points else None
            if fail is None and timed_out:
                return {"status": "timeout", "message": f"no N finished: {timed_out}", "lower_bound": None}
            advice = self.advice(smallest, fail)
            return {"status": fail["status"] if fail else "error", "lower_bound": None, "advice": advice,
                    "message": f"no N fits (smallest tried: {smallest})" + (f"; {advice}" if advice else "")
                    + ": " + (fail["message"] if fail else "")}
        unstable = self._unstable(verify) if verify else None
        if unstable:
            return {"status": "unstable", "message": unstable, "lower_bound": "unstable"}
        if timed_out:
            message, bound = f"max_n is a lower bound: {timed_out}", "timeout"
        elif capped and first_fail_n is None:
            message, bound = f"stopped at {self.cap} before any N failed: max_n is a lower bound", "capped"
        elif capped:
            message, bound = f"stopped at {self.cap} before the bisection reached probe.granularity", "capped"
        elif first_fail_n is None:
            message, bound = "", "no failure"
        else:
            message, bound = "", None if fail["status"] == "oom" else f"first failure {fail['status']}"
        if verify and verify.get("skipped"):
            message = "; ".join(m for m in (message, f"verification {verify['skipped']}") if m)
        return {"status": "ok", "message": message, "lower_bound": bound}


    def advice(self, smallest: int | None, fail: dict | None) -> str | None:
        """What to change when even the smallest N tried ran out of memory: a larger cap (when
        one is set), a smaller ``probe.start`` (when one fits the padding unit), more ranks."""
        if fail is None or fail["status"] != "oom" or smallest is None:
            return None
        options = []
        cap = self.point.memory_limit_gib
        if cap is not None:
            options.append(f"memory.limit_gib={_round_gib(2 * cap)} (now {cap:g} GiB/rank)")
        unit = self.point.padding_unit
        lower = smallest // 2 // unit * unit
        if lower >= max(unit, 1) and lower < smallest:
            options.append(f"probe.start={lower} (now {smallest})")
        options.append(f"cp={2 * self.point.cp}")
        return f"to find a max N pass {' or '.join(options)}"


def _step_seconds(result) -> dict:
    """``step_s`` (the step itself, slowest rank) and ``compile_s`` (``torch.compile`` inside it,
    slowest rank; 0 when the adapter reports none) of a point whose ranks all finished, and
    ``stage_peak_gib`` (per stage, the largest over ranks) where the adapter reports stage peaks;
    {} else. ``seconds`` minus ``step_s`` is the point's start-up: worker processes, model and batch."""
    steps = [(r.get("times_ms") or [None])[-1] for r in result.ranks]
    if not steps or any(t is None for t in steps):
        return {}
    stats = [r.get("stats") or {} for r in result.ranks]
    out = {"step_s": round(max(steps) / 1e3, 3),
           "compile_s": round(max(float(s.get("compile_s") or 0.0) for s in stats), 3)}
    stage_peaks: dict[str, float] = {}
    for s in stats:
        for stage, gib in (s.get("stage_peak_gib") or {}).items():
            if gib is not None:
                stage_peaks[stage] = round(max(stage_peaks.get(stage, 0.0), float(gib)), 4)
    if stage_peaks:
        out["stage_peak_gib"] = stage_peaks
    return out


def _round_gib(gib: float) -> str:
    return f"{gib:.3g}"


def run_probe(point: Point, runner: Runner, state_path: Path | None, signature: str) -> dict:
    """The probe fields of a result record (see cpbench/results.py)."""
    adapter = load_adapter(point.model)  # imports it; touches no GPU
    if point.probe.depth is not None and not supports_run_blocks(adapter):
        point = replace(point, probe=replace(point.probe, depth=None))
    return Probe(point, runner, state_path, signature, lean_fit=supports_lean(adapter)).run()


def _fmt(gib: float | None) -> str:
    return "-" if gib is None else f"{gib:.2f}"
