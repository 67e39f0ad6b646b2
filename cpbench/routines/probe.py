"""The max-N probe: ramp from ``probe.start`` ×``growth`` until a point fails, then bisect.

Every N tried is a multiple of the padding unit; the bisection stops when the gap between
the largest fitting N and the smallest failing N is at most ``probe.granularity``. A point
fits when every rank completed one full step (status ``ok``); any failure (``oom``,
``timeout``, ``error``) counts as not fitting and the search goes on.

Depth (``probe.depth``): an inference step's peak does not grow with the number of blocks
run, its time does; so when the adapter takes ``run_blocks`` the probe runs only that many
blocks. At the first point it checks the claim: the shortened step's peak must match the
full step's within ``DEPTH_TOLERANCE`` (else it falls back to full depth). ``probe.depth_check_n``
moves the check to a smaller N than ``probe.start`` (all blocks at a large N take minutes);
that point is measured like any other, and when it fits it is the lower end of the search.

State (``probe_state.json``, written atomically after every point) holds every measured
point; a restarted job with the same signature replays it and measures only what is new.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from cpbench.config import Point
from cpbench.harness.memory import MEASURE_CPU, MEASURE_CUDA
from cpbench.harness.runner import PointRun, Runner, point_record
from cpbench.models.api import load_adapter, supports_run_blocks
from cpbench.results import max_over_ranks, read_json, write_json_atomic

log = logging.getLogger("cpbench")

DEPTH_TOLERANCE = 0.01
# CPU peaks are resident-set sizes: page and malloc-arena granularity make a few MiB of
# noise, so on CPU the depth check also accepts this absolute difference.
CPU_DEPTH_FLOOR_GIB = 16 / 1024


class _PointCap(Exception):
    """probe.max_points reached, or probe.budget_s spent (the message says which)."""


class Probe:
    """One probe over a runner; ``run()`` returns the probe fields of the result record."""

    def __init__(self, point: Point, runner: Runner, state_path: Path | None, signature: str):
        self.point, self.runner, self.state_path, self.signature = point, runner, state_path, signature
        self.settings = point.probe
        state = self._load_state()
        self.points: dict[int, dict] = {p["N"]: p for p in state.get("points", [])}
        self.depth: int | None = state.get("depth", self.settings.depth)
        self.depth_verified: bool | None = state.get("depth_verified")
        self.depth_checked: bool = state.get("depth_checked", False)
        self.started_s, self.cap = time.monotonic(), ""

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
        write_json_atomic(self.state_path, {
            "signature": self.signature, "depth": self.depth, "depth_verified": self.depth_verified,
            "depth_checked": self.depth_checked, "points": self.ordered_points(),
            # what a report needs of a probe stopped before its result.json (results.incomplete_probe)
            "point": point_record(self.point)})

    def ordered_points(self) -> list[dict]:
        return sorted(self.points.values(), key=lambda p: p["order"])

    # ------------------------------------------------------------ measuring
    def _run(self, n: int, run_blocks: int | None):
        p = self.point
        return self.runner.run(PointRun(N=n, n_atoms=p.atoms_per_token * n, S=p.S,
                                        timeout_s=self.settings.timeout_s, run_blocks=run_blocks))

    def _check_depth(self, n: int):
        """First point: run full and shortened steps, keep the shortened depth if peaks agree."""
        full = self._run(n, None)
        short = self._run(n, self.depth)
        full_peak, short_peak = max_over_ranks(full.per_rank("peak_alloc_gib")), max_over_ranks(short.per_rank("peak_alloc_gib"))
        floor = CPU_DEPTH_FLOOR_GIB if self.point.device == "cpu" else 0.0
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

    def fits(self, n: int) -> bool:
        if n in self.points:
            return self.points[n]["fits"]
        if len(self.points) >= self.settings.max_points:
            raise _PointCap(f"probe.max_points={self.settings.max_points}")
        budget_s = self.settings.budget_s
        # supervisor 0's clock decides, so that every supervisor stops before the same point
        if budget_s is not None and self.runner.group.broadcast(time.monotonic() - self.started_s >= budget_s):
            raise _PointCap(f"probe.budget_s={budget_s:g}")
        if self.depth is not None and not self.depth_checked:
            result = self._check_depth(n)
        else:
            result = self._run(n, self.depth)
        record = {
            "N": n, "fits": result.status == "ok", "status": result.status, "message": result.message,
            "peak_alloc_gib": result.per_rank("peak_alloc_gib"),
            "peak_reserved_gib": result.per_rank("peak_reserved_gib"),
            "seconds": round(result.seconds, 3), "order": len(self.points),
        }
        self.points[n] = record
        self._save_state()
        peak = max_over_ranks(record["peak_alloc_gib"])
        log.info("probe N=%d %s peak=%s GiB %.1f s%s", n, "fits" if record["fits"] else result.status,
                 _fmt(peak), result.seconds, "" if record["fits"] else f" ({result.message[:200]})")
        return record["fits"]

    # ------------------------------------------------------------ search
    def search(self) -> tuple[int | None, int | None, bool]:
        """Ramp then bisect; returns (largest fitting N, smallest failing N, capped)."""
        s, unit = self.settings, self.point.padding_unit
        lo, hi = None, None
        try:
            check_n = s.depth_check_n  # <= start (config); a bound of the search either way
            if check_n is not None and (check_n in self.points or (self.depth is not None and not self.depth_checked)):
                if self.fits(check_n):
                    lo = check_n
                else:
                    hi = check_n
            n = s.start
            while hi is None:
                if self.fits(n):
                    lo = n
                    n = max(n + unit, -(-int(n * s.growth) // unit) * unit)
                else:
                    hi = n
            low = lo if lo is not None else 0
            while hi - low > s.granularity:
                mid = (low + hi) // 2 // unit * unit
                if mid <= low or mid < unit:
                    break
                if self.fits(mid):
                    lo = low = mid
                else:
                    hi = mid
        except _PointCap as cap:
            self.cap = str(cap)
            return lo, hi, True
        return lo, hi, False

    def run(self) -> dict:
        max_n, first_fail_n, capped = self.search()
        points = self.ordered_points()
        fail = self.points.get(first_fail_n) if first_fail_n is not None else None
        at_max = self.points.get(max_n) if max_n is not None else None
        blocks = self.point.model.get("blocks")
        out = {
            "max_n": max_n, "first_fail_n": first_fail_n,
            "first_fail_status": fail["status"] if fail else None,
            "first_fail_message": fail["message"] if fail else None,
            "depth": self.depth if self.depth is not None else (blocks if isinstance(blocks, int) else None),
            "depth_verified": self.depth_verified,
            "points": [{k: v for k, v in p.items() if k != "order"} for p in points],
            "peak_alloc_gib": max_over_ranks(at_max["peak_alloc_gib"]) if at_max else None,
            "peak_reserved_gib": max_over_ranks(at_max["peak_reserved_gib"]) if at_max else None,
            "peak_alloc_gib_per_rank": at_max["peak_alloc_gib"] if at_max else None,
            "peak_reserved_gib_per_rank": at_max["peak_reserved_gib"] if at_max else None,
            "memory_measure": MEASURE_CUDA if self.point.device == "cuda" else MEASURE_CPU,
        }
        if max_n is None:
            out["status"] = fail["status"] if fail else "error"
            smallest = min(self.points) if self.points else None
            out["message"] = f"no N fits (smallest tried: {smallest}): " + (fail["message"] if fail else "")
        else:
            out["status"] = "ok"
            if not capped:
                out["message"] = ""
            elif first_fail_n is None:
                out["message"] = f"stopped at {self.cap} before any N failed: max_n is a lower bound"
            else:
                out["message"] = f"stopped at {self.cap} before the bisection reached probe.granularity"
        return out


def adapter_takes_run_blocks(model_cfg: dict) -> bool:
    """Whether the model's adapter accepts ``run_blocks`` (imports it; touches no GPU)."""
    return supports_run_blocks(load_adapter(model_cfg))


def run_probe(point: Point, runner: Runner, state_path: Path | None, signature: str) -> dict:
    """The probe fields of a result record (see cpbench/results.py)."""
    if point.probe.depth is not None and not adapter_takes_run_blocks(point.model):
        from dataclasses import replace

        point = replace(point, probe=replace(point.probe, depth=None))
    return Probe(point, runner, state_path, signature).run()


def _fmt(gib: float | None) -> str:
    return "-" if gib is None else f"{gib:.2f}"
