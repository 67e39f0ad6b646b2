"""The kernel backends side by side: the same point under each ``model.kernels`` backend (time,
peak memory, speed-up over ``torch``) and, where ``scripts/kernel_parity.py`` left its JSON in
the run directory, each backend's deviation from the ``torch`` path."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from cpbench.report.analysis import TIMING_POINT, ok_timing
from cpbench.report.rows import (
    HARDWARE,
    day_of,
    ensure_hardware,
    several_hardware,
    short_gpu,
    with_hardware,
    without_training_path,
)

PARITY_GLOB = "kernel_parity*.json"


def backend_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The latest ok timing row per point and backend, for points measured under two backends
    or more, with ``speedup`` = the ``torch`` row's walltime over this one's. A compiled training
    point (``model [model.compile_training=true]``) pairs with the same model's ``torch`` point."""
    ok = ensure_hardware(ok_timing(rows))
    if ok.empty or "kernels" not in ok or ok["kernels"].dropna().nunique() < 2:
        return pd.DataFrame()
    ok = ok[ok["kernels"].notna()].copy()
    ok["model"] = ok["model"].map(lambda m: without_training_path(m) if isinstance(m, str) else m)
    order = ok.assign(_date=ok["date"].fillna("")).sort_values("_date", kind="stable")
    latest = order.drop_duplicates([*TIMING_POINT, "kernels"], keep="last").drop(columns="_date")
    several = latest.groupby(TIMING_POINT)["kernels"].transform("nunique") > 1
    latest = latest[several].copy()
    torch_ms = latest[latest["kernels"] == "torch"].set_index(TIMING_POINT)["walltime (ms)"]
    latest["speedup"] = [torch_ms.get(tuple(r[c] for c in TIMING_POINT), float("nan")) / r["walltime (ms)"]
                         for _, r in latest.iterrows()]
    return latest.sort_values([*TIMING_POINT, "kernels"])


def read_parity(root: Path) -> list[dict]:
    """Every comparison line of the ``kernel_parity*.json`` files under ``root`` (with its file)."""
    lines = []
    for path in sorted(Path(root).rglob(PARITY_GLOB)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        lines += [{**line, "file": str(path.relative_to(root)), "gpu": data.get("gpu"), "torch": data.get("torch")}
                  for line in data.get("results") or []]
    return lines


def backends_section(rows: pd.DataFrame, parity: list[dict]) -> str:
    """``## Kernel backends``: the side-by-side table and the parity table (each when present)."""
    table = backend_rows(rows)
    parts = ["## Kernel backends"]
    if table.empty and not parity:
        return parts[0] + "\n\nNo point was measured under two backends (`model.kernels`)."
    if not table.empty:
        parts.append("The same point under each `model.kernels` backend (latest ok timing per point and "
                     "backend); speed-up = the `torch` walltime over the row's. Rows of one point measured on "
                     "different dates were not run side by side: compare them with care.")
        lines = ["| model | workflow | CP config | N | backend | walltime (ms) | peak (GiB) | speed-up | date |",
                 "|---|---|---|---|---|---|---|---|---|"]
        several = several_hardware(table)
        for _, r in table.iterrows():
            speedup = "" if pd.isna(r["speedup"]) else f"{r['speedup']:.2f}×"
            model = with_hardware(r["model"], r[HARDWARE], several)
            lines.append(f"| {model} | {r['workflow']} | {r['CP config']} | {int(r['N_tokens']):,} | "
                         f"{r['kernels']} | {r['walltime (ms)']:,.1f} | {r['peak_mem (GiB)']:.2f} | {speedup} | "
                         f"{day_of(r.get('date'))} |")
        parts.append("\n".join(lines))
    if parity:
        parts.append("Deviation from the `torch` path (`scripts/kernel_parity.py`: norm-wise relative error of "
                     "the outputs and, where the training path ran, of every parameter gradient):")
        lines = ["| backend | what | dtype | N | worst output | median param grad | worst (where) | tolerance | ok | GPU |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for p in parity:
            worst_out = max((p.get("outputs") or {}).values(), default=float("nan"))
            grad = p.get("param_grad_median_rel")
            lines.append(f"| {p.get('backend')} | {p.get('what')} | {p.get('dtype')} | {p.get('N')} | {worst_out:.2e} | "
                         f"{'' if grad is None else f'{grad:.2e}'} | {p.get('worst_rel', float('nan')):.2e} "
                         f"({p.get('worst')}) | {p.get('tol')} | {'yes' if p.get('ok') else 'no'} | "
                         f"{short_gpu(p.get('gpu') or 'CPU')} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
