"""The report's markdown sections: run metadata, the results table, failures, plots, memory
model and FLOPs. Each function returns one section's markdown text (no trailing newline)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from cpbench.models.pairformer import flops
from cpbench.report.memory_table import memory_tables
from cpbench.report.rows import ENERGY_COLUMN, HARDWARE, STAGE_PEAK_PREFIX, STAGE_PREFIX, TABLE_COLUMNS
from cpbench.results import INCOMPLETE

DASH = "—"


def md_table(frame: pd.DataFrame, columns: list[str], fmt: dict[str, Callable[[Any], str]] | None = None) -> str:
    """A GitHub markdown table of ``frame[columns]``; ``fmt`` formats a column's cells."""
    fmt = fmt or {}
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for _, row in frame.iterrows():
        cells = []
        for col in columns:
            value = row.get(col)
            cell = fmt[col](value) if col in fmt else _plain(value)
            cells.append(cell.replace("|", "\\|").replace("\n", " "))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def _plain(value) -> str:
    if _missing(value):
        return DASH
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _num(digits: int) -> Callable[[Any], str]:
    return lambda v: DASH if _missing(v) else f"{float(v):.{digits}f}"


def _sig(digits: int) -> Callable[[Any], str]:
    """Significant digits: FLOP figures span CPU-test (1e-6) to GPU (1e3) magnitudes."""
    return lambda v: DASH if _missing(v) else f"{float(v):.{digits}g}"


def _bytes(value) -> str:
    if _missing(value):
        return DASH
    value = float(value)
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"


def _pct(value) -> str:
    return DASH if _missing(value) else f"{100 * float(value):.1f} %"


def _unique(values: Iterable) -> str:
    seen = []
    for v in values:
        if not _missing(v) and v not in seen and v != []:
            seen.append(v)
    if not seen:
        return DASH
    return ", ".join(_yes_no(v) if isinstance(v, bool) else str(v) for v in seen)


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


def metadata_section(records: list[dict], rows: pd.DataFrame, command: str | None) -> str:
    """Run metadata from every record's ``env`` and ``point`` (distinct values joined)."""
    envs = [r.get("env") or {} for r in records]

    def env(key: str) -> str:
        return _unique(e.get(key) if not isinstance(e.get(key), list) else _per_gpu(e.get(key)) for e in envs)

    dates = sorted(e["date"] for e in envs if e.get("date"))
    devices = _unique(e.get("device") for e in envs)
    items = [
        ("date", f"{dates[0]} … {dates[-1]}" if len(dates) > 1 and dates[0] != dates[-1] else (dates[0] if dates else DASH)),
        ("results", f"{len(records)} result.json"),
        ("host", env("host")),
        ("device", devices),
        ("GPU model", env("gpu_model")), ("GPU count", env("gpu_count")),
        ("GPU memory (GiB)", env("gpu_memory_gib")), ("driver", env("driver")),
        ("CPU", f"{env('cpu_model')} ({env('cpu_count')} cores)"),
        ("CP configs", _unique(rows["CP config"]) if not rows.empty else DASH),
        ("workflows", _unique(rows["workflow"]) if not rows.empty else DASH),
        ("model", _unique(rows["model"]) if not rows.empty else DASH),
        ("dtype", _unique(rows["dtype"]) if not rows.empty else DASH),
        ("memory cap per rank (GiB)", _unique((r.get("point") or {}).get("memory_limit_gib") for r in records)),
        ("peak memory measured as", _unique(r.get("memory_measure") for r in records)),
        ("torch", env("torch")), ("CUDA", env("cuda")), ("NCCL", env("nccl")),
        ("SM clock current / max (MHz)", f"{env('sm_clock_mhz')} / {env('sm_clock_max_mhz')}"),
        ("clocks locked", env("clocks_locked")),
        ("node shared (other processes on the GPUs)", env("node_shared")),
        ("ECC", env("ecc_enabled")),
        ("git commit", env("git_commit")),
        ("command", f"`{command}`" if command else "not recorded"),
    ]
    if devices == "cpu":  # GPU rows say nothing on a CPU run
        items = [(k, v) for k, v in items if not k.startswith(("GPU", "driver", "SM clock", "ECC", "clocks", "node"))]
    frame = pd.DataFrame(items, columns=["", "value"])
    return "## Run metadata\n\n" + md_table(frame, ["", "value"])


def _per_gpu(values: list):
    """A per-GPU list as one value when all GPUs agree, else the list as text."""
    distinct = {str(v) for v in values}
    return values[0] if len(distinct) == 1 else "/".join(str(v) for v in values)


def results_section(rows: pd.DataFrame) -> str:
    """The skill's table, extra columns after the first six, and the failure messages."""
    if rows.empty:
        return "## Results\n\nNo result.json found."
    table = rows.copy()
    table["N_tokens"] = [_n_cell(r) for _, r in table.iterrows()]
    table["peak_mem (GiB)"] = [_peak_cell(r) for _, r in table.iterrows()]
    stages = sorted(c for c in table.columns if c.startswith(STAGE_PREFIX))
    table["stage times (ms)"] = [
        ", ".join(f"{c[len(STAGE_PREFIX):]} {float(r[c]):.1f}" for c in stages if not _missing(r[c])) or DASH
        for _, r in table.iterrows()]
    peaks = sorted(c for c in table.columns if c.startswith(STAGE_PEAK_PREFIX))
    table["stage peaks (GiB)"] = [
        ", ".join(f"{c[len(STAGE_PEAK_PREFIX):]} {float(r[c]):.2f}" for c in peaks if not _missing(r[c])) or DASH
        for _, r in table.iterrows()]
    extra = ["workflow", "status", "IQR (ms)", "tokens/s", "TFLOP/s/GPU", "MFU"]
    for optional in ("comm bytes/block", "comm share", ENERGY_COLUMN):
        if optional in table and table[optional].notna().any():
            extra.append(optional)
    if stages:
        extra.append("stage times (ms)")
    if peaks:
        extra.append("stage peaks (GiB)")
    for context in ("model", HARDWARE, "dtype"):  # shown only when the rows differ in it (else: metadata)
        if context in table and table[context].nunique() > 1:
            extra.insert(0, context)
    fmt = {"walltime (ms)": _num(2), "IQR (ms)": _num(2), "tokens/s": _num(0), "TFLOP/s/GPU": _sig(3),
           "MFU": _pct, "comm bytes/block": _bytes, "comm share": _pct, ENERGY_COLUMN: _num(1)}
    text = ["## Results", "",
            "One row per job. `max-fit` rows come from the max-N probe: N_tokens is the largest N "
            "measured to fit and peak_mem reads `peak (CAUSE@first failing N)`; status `incomplete`: the "
            "probe was stopped before it finished (read from its probe_state.json), so its max N is a "
            "lower bound, as it is when no N ran out of memory (no failure, ERROR, or `≥ N` with "
            "`timeout at N`: a point that timed out bounds nothing) and when a re-run of the max N or "
            "of the first failing N disagreed with its first run (status `unstable`). peak_mem is the per-rank "
            "peak (max over ranks, allocated); walltime is the median over repeats of the slowest rank "
            "per iteration.", "",
            md_table(table, list(TABLE_COLUMNS) + extra, fmt), "",
            "The same rows, unformatted and with every field, are in the CSV beside this file."]
    failed = rows[(rows["status"] != "ok") & (rows["message"].fillna("") != "")]
    if not failed.empty:
        text += ["", "Jobs that did not finish ok:", ""]
        text += [f"- {_plain(r['workflow'])} {r['CP config']} N={_plain(r['N_tokens'])}: {r['status']}: {r['message'][:200]}"
                 f" (`{r['result']}`)" for _, r in failed.iterrows()]
    return "\n".join(text)


def _n_cell(row) -> str:
    n = _plain(row["N_tokens"])
    if row["row"] != "max-fit":
        return n
    # a timeout bounds nothing: the max N is at least this (not a failure size above it)
    bound = "≥ " if row.get("lower_bound") in ("timeout", "unstable") and not _missing(row["N_tokens"]) else ""
    return f"max-fit {bound}{n}"


def _peak_cell(row) -> str:
    peak = _num(2)(row["peak_mem (GiB)"])
    if row["row"] != "max-fit" or row["status"] not in ("ok", INCOMPLETE, "unstable"):
        return peak
    notes = []
    timeout_n = row.get("timeout_n")
    timed_out = not _missing(timeout_n)
    if not _missing(row.get("first_fail_n")) and not (timed_out and row["first_fail_n"] == timeout_n):
        notes.append(f"{str(row.get('first_fail_status') or 'fail').upper()}@{int(row['first_fail_n'])}")
    if timed_out:
        notes.append(f"timeout at {int(timeout_n)}")
    if row["status"] == "unstable":
        notes.append("unstable")
    return f"{peak} ({'; '.join(notes) or 'no failure'})"


def plots_section(plots: list[tuple[str, str, Path | None, str | None]]) -> str:
    text = ["## Plots", ""]
    for _, title, path, reason in plots:
        text.append(f"![{title}]({path.name})" if path else f"- {title}: not drawn, {reason}.")
        text.append("")
    return "\n".join(text).rstrip()


def memory_section(records: list[dict], rows: pd.DataFrame) -> str:
    """Fits per probe, predicted max N at other GPU sizes and cp, beside measurements."""
    fits, predictions = memory_tables(records)
    head = ["## Memory model", "",
            "Per-rank peak memory vs N fitted as a·N² + b·N + c (least squares, no coefficient below 0: the "
            "form column names the terms kept) on the probe points that "
            "fit; other cp scale the pair (N²) term by cp_fit/cp, so a fit without it predicts its own cp "
            "only. Predicted max N is where the fitted peak "
            "reaches the GPU memory; it ignores the CUDA context and fragmentation, so read it as an upper "
            "bound."]
    if fits.empty:
        return "\n".join(head + ["", "Not fitted: no probe result with a point that fit."])
    head += ["", md_table(fits, list(fits.columns)), "",
             "Predicted max N (columns: per-GPU memory) and, where this run measured the same cp, "
             "the prediction at the measured cap beside the measured max N:", "",
             md_table(predictions, list(predictions.columns))]
    return "\n".join(head)


def flops_section(rows: pd.DataFrame, records: list[dict]) -> str:
    """Per-op FLOPs of one block at the largest N measured, the step multipliers, the MFU peak."""
    refs = [r for r in records if flops.is_reference_trunk((r.get("point") or {}).get("model"))]
    if not refs:
        return "## FLOPs\n\nNo result of the reference Pairformer trunk: no analytic FLOP count applies."
    model = refs[0]["point"]["model"]
    sizes = flops.PairformerSizes.from_config(model)
    n_max = int(pd.to_numeric(rows["N_tokens"], errors="coerce").max()) if rows["N_tokens"].notna().any() else 1024
    per_op = flops.block_flops(n_max, sizes)
    frame = pd.DataFrame([{"op": op, f"GFLOP per block at N={n_max}": per_op[op] / 1e9,
                           "share": per_op[op] / per_op["block"]} for op in flops.BLOCK_OPS + ("block",)])
    configs = [r.get("config") or {} for r in refs]
    bases = sorted({flops.step_flops(n_max, sizes, train=bool(w.get("train")), recycles=int(w.get("recycles") or 0),
                                     checkpointing=bool(w.get("checkpointing")),
                                     checkpoint_ops=bool(m.get("checkpoint_ops", True)))["basis"]
                    for w, m in ((c.get("workflow") or {}, c.get("model") or {}) for c in configs)})
    sources = sorted(set(rows["peak source"].dropna())) if "peak source" in rows else []
    text = ["## FLOPs", "",
            f"Analytic forward matmul FLOPs of one Pairformer block ({model.get('name')}: c_s={sizes.c_s}, "
            f"c_z={sizes.c_z}, {sizes.heads_single} single heads, triangle attention {sizes.heads_tri}×"
            f"{sizes.head_dim_tri}, transitions ×{sizes.transition_factor}, {sizes.blocks} blocks); 2 FLOPs per "
            "multiply-add; element-wise work, the input embedder, MSA module, atom encoder and sampler not "
            "counted; N unpadded "
            "(see `cpbench/models/pairformer/flops.py`).", "",
            md_table(frame, list(frame.columns), {f"GFLOP per block at N={n_max}": _sig(4), "share": _pct}), "",
            "Step FLOPs: " + "; ".join(bases) + ". TFLOP/s/GPU = the step's Pairformer model FLOPs / time / cp, "
            "the time being the measured trunk stage for inference where the adapter reports it (it also holds "
            "the MSA module; embedding and sampling are outside it), else the median step walltime "
            "(column `flops time` of the CSV says which).",
            "MFU peak: " + ("; ".join(sources) if sources else "none known for this device, so no MFU is shown"
                            " (set `report.peak_tflops`)") + "."]
    return "\n".join(text)
