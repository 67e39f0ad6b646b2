"""The probe's ``predict`` strategy: where to look for the max N before bisecting.

Owns three things: the per-rank memory a probe runs against (``memory_capacity_gib``), the
predicted max N from the peaks of the points that fit (``predict_max_n``, through the shared
fit of ``cpbench.results.memory_fit``), and the bracket around it that the probe measures
first (``bracket_ends``). The measuring and the widening of the bracket are the probe's
(``cpbench.routines.probe``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cpbench.config import Point
from cpbench.results.memory_fit import MemoryFit, fit_peak_memory, fitting_points

PREDICT_POINTS = 3          # fitting points (distinct N) the ramp measures before the prediction
BRACKET_FRACTION = 0.05     # half-width of a loose first bracket, relative to the predicted N (a wrong end widens it)
# A fit this close to its points gets a bracket one granularity wide around the prediction. On one
# H200 the lean fit of N=1,024-4,096 had a 2.4 % residual and predicted the peak at N=16,512
# within 0.7 % (132.5 against 133.4 GiB reserved).
TIGHT_FIT_RESIDUAL = 0.05
# The fit's N² term must hold this share of the peak at the largest fitted N for a prediction
# (on one H200 a 1d cp=2 trunk's lean points had 61 % at N=4,096 and predicted within 6.3 %).
QUADRATIC_SHARE_MIN = 0.25


@dataclass(frozen=True)
class Prediction:
    """What the ``predict`` strategy found; ``fallback`` says why it bisected instead."""

    predicted_max_n: int | None = None
    capacity_gib: float | None = None
    capacity_source: str | None = None
    fit: MemoryFit | None = None
    n_range: tuple[int, int] | None = None
    bracket: tuple[int, int] | None = None
    fallback: str | None = None

    def record(self, max_n: int | None) -> dict:
        """The ``prediction`` block of result.json, with the relative error at the measured max N."""
        fit = None
        if self.fit is not None:
            fit = self.fit.record() | {"n_min": self.n_range[0], "n_max": self.n_range[1]}
        error = None
        if self.predicted_max_n is not None and max_n:
            error = round((self.predicted_max_n - max_n) / max_n, 4)
        return {"capacity_gib": self.capacity_gib, "capacity_source": self.capacity_source, "fit": fit,
                "bracket": list(self.bracket) if self.bracket else None, "error_at_max_n": error,
                "fallback": self.fallback}


def memory_capacity_gib(point: Point, broadcast: Callable) -> tuple[float | None, str | None]:
    """(GiB per rank, where the figure comes from) the probe's peaks run against.

    ``memory.limit_gib`` when set (the cap a worker enforces; on a CPU the only one), else on
    CUDA the GPU's total memory through NVML (supervisor 0's answer, so that every supervisor
    predicts the same N); (None, None) when neither is known. Emulated CP holds
    ``emulate.comm_reserve_gib`` back from either (``harness.memory.apply_limit``).
    """
    reserve = point.comm_reserve_gib if point.emulate else 0.0
    less = f" - emulate.comm_reserve_gib {reserve:g}" if reserve else ""
    if point.memory_limit_gib is not None:
        return float(point.memory_limit_gib) - reserve, "memory.limit_gib" + less
    total = None
    if point.device == "cuda":
        from cpbench.harness.env import nvml_metadata

        try:
            total = nvml_metadata().get("gpu_memory_gib")
        except Exception:  # noqa: BLE001 - no NVML answer: the probe bisects instead
            total = None
        total = broadcast(total)
    return (float(total) - reserve, "gpu_memory_gib" + less) if total else (None, None)


def predict_max_n(points: list[dict], capacity: tuple[float | None, str | None], cp: int, unit: int) -> Prediction:
    """The N (a multiple of ``unit``) where the fitted per-rank peak of ``points`` meets the capacity.

    Needs ``PREDICT_POINTS`` distinct N that fit with a measured peak; the fit is the report's
    (``fitting_points``: reserved memory when every point has it, else allocated).
    """
    capacity_gib, source = capacity
    if capacity_gib is None:
        return Prediction(fallback="no per-rank memory known (memory.limit_gib unset, no GPU total)")
    ns, peaks = fitting_points(points)
    if len(set(ns)) < PREDICT_POINTS:
        return Prediction(capacity_gib=capacity_gib, capacity_source=source,
                          fallback=f"{len(set(ns))} of {PREDICT_POINTS} points fit with a measured peak")
    fit = fit_peak_memory(ns, peaks, cp=cp)
    quadratic_gib = fit.a * ns[-1] ** 2
    if quadratic_gib < QUADRATIC_SHARE_MIN * fit.predict_gib(ns[-1]):
        # Peaks that grow about linearly over the cheap points say little of the N² term that
        # sets the limit (a 2x2 grid's N=1,024-4,096 peaks on one H200: the fit predicted 251,944
        # where 33,354 ran out of memory), so extrapolating them is a guess: bisect instead.
        return Prediction(capacity_gib=capacity_gib, capacity_source=source, fit=fit, n_range=(ns[0], ns[-1]),
                          fallback=f"the fit's N² term is {quadratic_gib:.2f} GiB of the peak at N={ns[-1]} "
                                   f"(< {QUADRATIC_SHARE_MIN:.0%}): the points do not show what sets the limit")
    predicted = fit.max_n(capacity_gib, unit=unit)
    fallback = None if predicted is not None else "the fitted peak does not reach the memory (or not even N=unit fits)"
    return Prediction(predicted, capacity_gib, source, fit, (ns[0], ns[-1]), fallback=fallback)


def bracket_ends(predicted: int, granularity: int, unit: int, fit: MemoryFit | None = None) -> tuple[int, int]:
    """(lower end, upper end) of the first bracket, on multiples of ``unit`` (lower end >= unit).

    A tight fit (more points than terms, and every fitted point within ``TIGHT_FIT_RESIDUAL``:
    three points through three terms fit exactly whatever the peaks) gives one granularity step
    centred on the prediction: when both ends agree the search is done in two points, and
    neither end sits at the predicted edge itself, where a re-run can land on either side (on a
    CPU, resident-set noise made such a max N fit once and fail once). Otherwise
    ±``BRACKET_FRACTION`` of the prediction, at least one granularity step each side, centred half
    a step above the prediction: bisecting a bracket centred on it would try the predicted edge
    itself first (a CI run on the CPU: N=1,446 ran out of memory, then fit on its re-run), while
    this one's first midpoint is half a step above it and, when the prediction holds, the search
    ends on the two points half a step either side, as with a tight fit.
    """
    if fit is not None and fit.n_points > fit.terms and fit.max_rel_residual <= TIGHT_FIT_RESIDUAL:
        low = max(unit, (predicted - granularity // 2) // unit * unit)
        return low, low + -(-granularity // unit) * unit
    half, centre = max(granularity, int(predicted * BRACKET_FRACTION)), predicted + granularity // 2
    low = max(unit, (centre - half) // unit * unit)
    high = -(-(centre + half) // unit) * unit
    return low, high
