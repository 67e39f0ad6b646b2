"""The memory model's tables for the report: one fit per probe result, predictions vs measured.

A stock model's probe (``model=stock/*``) is fitted like any other and predicts its max N at the
GPU sizes of ``GPU_MEMORY_SIZES_GIB``, at cp=1 only (a single-GPU baseline)."""

from __future__ import annotations

import pandas as pd

from cpbench.report.memory_model import GPU_MEMORY_SIZES_GIB
from cpbench.report.rows import cp_config_label, model_label, stock_title, workflow_label
from cpbench.results.memory_fit import MemoryFit, fit_peak_memory, fitting_points

TARGET_CPS = (1, 2, 4, 8)


def capacity_gib(record: dict) -> float | None:
    """The per-rank memory the probe ran against: ``memory.limit_gib`` when numeric, else the
    GPU's memory from the metadata; None when neither is known (e.g. an unresolved ``auto``)."""
    memory = (record.get("config") or {}).get("memory") or {}
    point = record.get("point") or {}
    for value in (point.get("memory_limit_gib"), record.get("memory_limit_gib"), memory.get("limit_gib")):
        try:
            if value is not None and float(value) > 0:
                return float(value)
        except (TypeError, ValueError):
            continue
    env = record.get("env") or {}
    if env.get("device") == "cuda" and env.get("gpu_memory_gib"):
        return float(env["gpu_memory_gib"])
    return None


def probe_fits(records: list[dict]) -> list[dict]:
    """Per probe result with a fitting point: its group, cp, fit, cap and measured max N."""
    out = []
    for rec in records:
        if rec.get("routine") != "probe":
            continue
        ns, peaks = fitting_points(rec.get("points") or [])
        if not ns:
            continue
        point = rec.get("point") or {}
        stock = stock_title(point.get("model"))
        out.append({
            "group": (model_label(rec), workflow_label(point), point.get("topology"),
                      point.get("dtype"), point.get("S")),
            # the N range tells apart two probes of the same configuration (a rerun, a longer limit)
            "label": (f"stock {stock} trunk: " if stock else "") + f"{workflow_label(point)} {cp_config_label(point)}, "
                     f"N {ns[0]:,}" + (f"–{ns[-1]:,}" if ns[-1] != ns[0] else ""),
            "cp": int(point.get("cp") or 1), "single_gpu": stock is not None,
            "fit": fit_peak_memory(ns, peaks, cp=int(point.get("cp") or 1)),
            "cap_gib": capacity_gib(rec), "max_n": rec.get("max_n"), "first_fail_n": rec.get("first_fail_n"),
        })
    return out


def memory_tables(records: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fits table, predictions table); both empty when no probe has a point that fit. A probe
    measured twice with the same peaks (the same job run again) gives one row, not two."""
    probes = probe_fits(records)
    fits = pd.DataFrame([{
        "fit from": p["label"], "form": p["fit"].form, "a (GiB/N²)": f"{p['fit'].a:.4g}",
        "b (GiB/N)": f"{p['fit'].b:.4g}", "c (GiB)": f"{p['fit'].c:.4g}", "points": p["fit"].n_points,
        "max residual": f"{100 * p['fit'].max_rel_residual:.1f} %",
    } for p in probes])
    rows = []
    for src in probes:
        same_group = [p for p in probes if p["group"] == src["group"]]
        # only the N² (pair) term carries a fit to another cp: without it, its own cp alone; a
        # stock model is a single-GPU baseline (cp=1 only): its predictions are its GPU sizes alone
        scalable = src["fit"].a > 0 and not src["single_gpu"]
        cps = {p["cp"] for p in same_group} | set(TARGET_CPS) if scalable else {src["cp"]}
        for cp in sorted(cps):
            row = {"fit from": src["label"], "cp": cp}
            for size in GPU_MEMORY_SIZES_GIB:
                row[f"{size} GiB"] = _fmt(src["fit"].max_n(size, cp=cp))
            row.update(_beside_measured(src["fit"], cp, [p for p in same_group if p["cp"] == cp]))
            rows.append(row)
    return fits.drop_duplicates(ignore_index=True), pd.DataFrame(rows).drop_duplicates(ignore_index=True)


def _beside_measured(fit: MemoryFit, cp: int, measured: list[dict]) -> dict[str, str]:
    """Prediction at the cap the measurement ran under, the measured max N, the relative error.

    Of several probes of the same group and cp, the largest max N is the measurement (as in the
    readout: a probe stopped early, or cut by a timeout, only bounds it from below). A probe read
    from its probe_state.json has no recorded cap: its max N is shown without a prediction."""
    cells = {"cap (GiB)": "—", "predicted": "—", "measured": "—", "error": "—"}
    known = [p for p in measured if p["max_n"]]
    if not known:
        return cells
    m = max(known, key=lambda p: p["max_n"])
    cells["measured"] = f"{m['max_n']} (fails {m['first_fail_n']})" if m["first_fail_n"] else str(m["max_n"])
    if not m["cap_gib"]:
        return cells
    predicted = fit.max_n(m["cap_gib"], cp=cp)
    cells.update({"cap (GiB)": f"{m['cap_gib']:g}", "predicted": _fmt(predicted)})
    if predicted:
        cells["error"] = f"{100 * (predicted - m['max_n']) / m['max_n']:+.1f} %"
    return cells


def _fmt(n: int | None) -> str:
    return "—" if n is None else str(n)
