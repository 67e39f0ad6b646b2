"""The CP curve: max N against CP size, measured and emulated side by side, and the emulated
timings beside their measured twins.

``cp_curve_section`` writes, per hardware, model and workflow, one table row per topology and kind
(measured, or ``emulated``: rank 0 of cp=K alone over the fake process group) and one column per
CP size, with the ideal √K line from the cp=1 max N; then, where a configuration has both a
measured and an emulated figure, both and their ratio. ``emulated_timing_section`` lists the
emulated timings (per-rank compute, the modelled communication, the predicted step range and
the dominant cost) beside the measured timing of the same point where one exists.
"""

from __future__ import annotations

import math

import pandas as pd

from cpbench.report.analysis import best_fit_per_cp, is_lower_bound, latest_ok_timing
from cpbench.report.rows import EMULATED, HARDWARE, ensure_hardware, several_hardware, with_hardware

DASH = "—"


def _fits(rows: pd.DataFrame) -> pd.DataFrame:
    if rows.empty:
        return rows
    fits = ensure_hardware(rows)
    fits = fits[(rows["row"] == "max-fit") & rows["N_tokens"].notna()]
    emulated = fits["emulated"].fillna(False).astype(bool) if "emulated" in fits else False
    return fits.assign(emulated=emulated)


def _cell(best: pd.DataFrame) -> str:
    n = int(best["N_tokens"].iloc[0])
    return f"{'≥ ' if bool(is_lower_bound(best).iloc[0]) else ''}{n:,}"


def cp_curve_section(rows: pd.DataFrame) -> str:
    """The "CP curve" section (see the module docstring)."""
    fits = _fits(rows)
    text = ["## The CP curve", ""]
    if fits.empty:
        return "\n".join(text + ["No probe found a max N in these results."])
    text += ["Max N per CP size: measured, and `emulated` (rank 0 of cp=K alone on one device over torch's fake "
             "process group, `emulate=true`: its per-rank memory is exact, less the communicator's allowance "
             "`emulate.comm_reserve_gib` held back). The ideal row scales the cp=1 max N by √K (per-rank pair memory "
             "O(N²/K)). `≥`: a lower bound. Plot: the max N plot below.", ""]
    pairs = []
    several = several_hardware(fits)
    for (hardware, model, workflow), same in fits.groupby([HARDWARE, "model", "workflow"], sort=True):
        cps = sorted(int(c) for c in same["cp"].dropna().unique())
        model = with_hardware(str(model), hardware, several)
        text += [f"**{model}, {workflow}**", "", "| | " + " | ".join(f"cp={c}" for c in cps) + " |",
                 "|---|" + "---|" * len(cps)]
        cp1 = best_fit_per_cp(same[(same["cp"] == 1) & ~same["emulated"]])
        for (topology, emulated), grp in same.groupby(["topology", "emulated"], sort=True):
            cells = []
            for c in cps:
                best = best_fit_per_cp(grp[grp["cp"] == c])
                cells.append(_cell(best) if not best.empty else DASH)
            text.append(f"| {topology} {EMULATED if emulated else 'measured'} | " + " | ".join(cells) + " |")
        if not cp1.empty:
            base = int(cp1["N_tokens"].iloc[0])
            text.append("| ideal √K from cp=1 | " + " | ".join(f"{int(base * math.sqrt(c)):,}" for c in cps) + " |")
        text.append("")
        pairs += _measured_and_emulated(same, model, workflow)
    if pairs:
        text += ["Configurations with both a measured and an emulated max N:", "",
                 "| model | workflow | CP config | measured | emulated | emulated / measured |", "|---|---|---|---|---|---|"]
        text += pairs
    return "\n".join(text).rstrip()


def _measured_and_emulated(same: pd.DataFrame, model, workflow) -> list[str]:
    out = []
    for (topology, cp), grp in same.groupby(["topology", "cp"], sort=True):
        measured, emulated = best_fit_per_cp(grp[~grp["emulated"]]), best_fit_per_cp(grp[grp["emulated"]])
        if measured.empty or emulated.empty:
            continue
        ratio = int(emulated["N_tokens"].iloc[0]) / int(measured["N_tokens"].iloc[0])
        out.append(f"| {model} | {workflow} | {measured['CP config'].iloc[0]} | {_cell(measured)} | {_cell(emulated)} | "
                   f"{ratio:.3f} |")
    return out


def emulated_timing_section(rows: pd.DataFrame) -> str:
    """Emulated timings (per-rank compute, modelled communication, predicted step range) beside the
    measured timing of the same model, workflow, CP config, kernels and N where one exists."""
    ok = latest_ok_timing(ensure_hardware(rows)) if not rows.empty else rows
    if ok.empty or "emulated" not in ok or not ok["emulated"].fillna(False).any():
        return ""
    emulated = ok[ok["emulated"].fillna(False).astype(bool)]
    measured = ok[~ok["emulated"].fillna(False).astype(bool)]
    text = ["## Emulated timings", "",
            "Per-rank compute of rank 0 of cp=K alone (`emulate=true`: every collective free), the communication a "
            "link model gives the step's counted collectives (`link=`, `stats.comm_step`), the predicted step "
            "(compute + communication without overlap down to their max with full overlap) and the dominant cost; "
            "the measured step of the same point where one ran, and measured / emulated.", "",
            "| model | workflow | CP config | N | kernels | compute (ms) | comm (ms, modelled) | link | step (ms, predicted) "
            "| dominant | measured (ms) | measured / emulated |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    several = several_hardware(ok)
    for _, r in emulated.sort_values([HARDWARE, "model", "workflow", "N_tokens", "cp", "CP config"]).iterrows():
        twin = measured[(measured[HARDWARE] == r[HARDWARE]) & (measured["model"] == r["model"])
                        & (measured["workflow"] == r["workflow"])
                        & (measured["CP config"] == r["CP config"].removesuffix(f" {EMULATED}"))
                        & (measured["N_tokens"] == r["N_tokens"]) & (measured["kernels"] == r["kernels"])]
        twin_ms = float(twin["walltime (ms)"].iloc[-1]) if not twin.empty else None
        comm, ratio = r.get("comm (ms, modelled)"), (twin_ms / float(r["walltime (ms)"]) if twin_ms else None)
        text.append(
            f"| {with_hardware(r['model'], r[HARDWARE], several)} | {r['workflow']} | {r['CP config']} | "
            f"{int(r['N_tokens']):,} | {r.get('kernels') or DASH} | "
            f"{float(r['walltime (ms)']):,.1f} | {_num(comm)} | {_text(r.get('link'))} | "
            f"{_text(r.get('step range (ms, modelled)'))} | {_text(r.get('dominant cost'))} | "
            f"{_num(twin_ms)} | {f'{ratio:.4f}' if ratio else DASH} |")
    return "\n".join(text)


def _text(value) -> str:
    return DASH if value is None or (isinstance(value, float) and math.isnan(value)) or value == "" else str(value)


def _num(value) -> str:
    return DASH if value is None or (isinstance(value, float) and math.isnan(value)) else f"{float(value):,.1f}"
