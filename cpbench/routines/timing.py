"""The timing routine: warmup then repeats on fresh workers; the slowest rank per iteration.

Each rank runs ``timing.warmup`` (>= 3) then ``timing.repeats`` (>= 5) steps, with a barrier
and ``torch.cuda.synchronize()`` around each (``cpbench.harness.worker``); an iteration's time is the
slowest rank's, since the step is done only when every rank is. Peak memory is the max over
ranks (per rank beside it); with ``profile=true`` every rank writes a torch.profiler trace
of its first timed iteration beside result.json; with ``memory.breakdown=true`` every rank runs
one more step, untimed, whose peak it breaks down (``cpbench.harness.breakdown``), and the record
keeps the breakdown of the rank with the highest peak.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from cpbench.config import Point
from cpbench.harness.runner import PointRun, Runner
from cpbench.link import link_from_config, predict


def summarize_times(times_per_rank: list[list[float]]) -> dict:
    """Per-iteration slowest-rank times (ms) and their median, IQR, min, max."""
    times_ms = [max(it) for it in zip(*times_per_rank)]
    q1, _, q3 = statistics.quantiles(times_ms, n=4, method="inclusive") if len(times_ms) > 1 else (times_ms * 3)
    return {"times_ms": [round(t, 4) for t in times_ms], "median_ms": statistics.median(times_ms),
            "iqr_ms": q3 - q1, "min_ms": min(times_ms), "max_ms": max(times_ms)}


def comm_model(point: Point, counts: dict, median_ms: float) -> dict:
    """The ``comm_model`` block: the link's time for the step's counted collectives
    (``cpbench.link.predict``). Emulated, the median is compute alone and the block's range is
    the predicted step; measured, the median already holds the communication (``measured_ms``)."""
    block = predict(link_from_config(point.link), counts, median_ms)
    if not point.emulate:  # the measured step is compute and communication already
        for key in ("compute_ms", "step_ms_range", "dominant"):
            block.pop(key)
        block["measured_ms"] = round(median_ms, 3)
    return block


def peak_rank_breakdown(breakdowns: list[dict | None]) -> dict:
    """The breakdown of the rank whose breakdown peak is highest (``rank`` added): the rank that
    decides whether a size fits; the first rank's error where none has a peak."""
    ranked = [(b.get("peak_gib", -1.0), -r, r, b) for r, b in enumerate(breakdowns) if isinstance(b, dict)]
    ranked.sort(key=lambda item: item[:2], reverse=True)
    _, _, rank, chosen = ranked[0]
    return {"rank": rank, **chosen}


def run_timing(point: Point, runner: Runner, out_dir: Path | None) -> dict:
    """The timing fields of a result record (see cpbench/results.py)."""
    t = point.timing
    profile_path = str(out_dir / "trace_rank{rank}.json") if point.profile and out_dir is not None else None
    result = runner.run(PointRun(N=point.N, n_atoms=point.N_atoms, S=point.S, timeout_s=t.timeout_s,
                                 warmup=t.warmup, repeats=t.repeats, profile_path=profile_path,
                                 count_collectives=True, memory_breakdown=point.memory_breakdown,
                                 breakdown_sites=point.breakdown_sites))
    alloc, reserved = result.per_rank("peak_alloc_gib"), result.per_rank("peak_reserved_gib")
    known = [a for a in alloc if a is not None]
    out = {"status": result.status, "message": result.message, "seconds": round(result.seconds, 3),
           "peak_alloc_gib": max(known) if known else None,
           "peak_reserved_gib": max((r for r in reserved if r is not None), default=None),
           "peak_alloc_gib_per_rank": alloc, "peak_reserved_gib_per_rank": reserved,
           "memory_measure": result.ranks[0].get("memory_measure") if result.ranks else None}
    if result.status != "ok":
        progress = (result.ranks[0].get("progress") or {}) if result.ranks else {}
        if progress.get("warmup_ms") or progress.get("times_ms"):  # a timeout: the steps rank 0 finished
            out["partial"] = progress
        return out
    out.update(summarize_times(result.per_rank("times_ms")))
    out["times_ms_per_rank"] = [[round(t, 4) for t in ts] for ts in result.per_rank("times_ms")]
    out["warmup_ms"] = [round(max(it), 4) for it in zip(*result.per_rank("warmup_ms"))]
    if point.emulate and result.ranks and result.ranks[0].get("emulation_fill_ms") is not None:
        out["emulation_fill_ms"] = result.ranks[0]["emulation_fill_ms"]  # taken out of times_ms
    out["tokens_per_s"] = point.N / (out["median_ms"] / 1e3) if out["median_ms"] > 0 else None
    out["loss"] = result.ranks[0].get("loss")
    out["stats"] = result.ranks[0].get("stats") or {}
    counts = out["stats"].get("comm_step")
    if counts and point.link:  # what the step's collectives cost on the configured link
        out["comm_model"] = comm_model(point, counts, out["median_ms"])
    energy = result.per_rank("energy_j_per_step")  # NVML, per rank's GPU; absent without the counter
    if any(e is not None for e in energy):
        out["energy_j_per_step_per_rank"] = energy
    breakdowns = result.per_rank("memory_breakdown")
    if any(b is not None for b in breakdowns):
        out["memory_breakdown"] = peak_rank_breakdown(breakdowns)
    if profile_path:
        out["profile_traces"] = [Path(profile_path.format(rank=r)).name for r in range(point.ranks_launched)]
    return out
