"""The report's one-paragraph readout, written from the data only.

Says, where the results hold it: max N at each cp against cp=1 (and against a user-supplied
single-GPU baseline, else against a stock model's single-GPU max N of the same workflow:
``model=stock/*``), how walltime scales with N and with cp, whether compute or communication
dominates (only where communication was measured), the best MFU, which CP sizes were measured
and which not (too few GPUs here, or every row failed), and how many jobs failed.
"""

from __future__ import annotations

import math

import pandas as pd

from cpbench.report.analysis import (
    COARSE_GAP_TOKENS,
    StockBaseline,
    best_fit_per_cp,
    is_lower_bound,
    latest_ok_timing,
    ratio_mark,
    repeated_timing_points,
    stock_baseline_for,
    stock_baselines,
    walltime_exponent,
    with_kernel_labels,
)
from cpbench.report.rows import HARDWARE, ensure_hardware, several_hardware, with_hardware


def _n(value) -> str:
    return f"{int(value):,}"


def _group_label(model: str, workflow: str, topology: str, with_model: bool) -> str:
    return f"{workflow} ({topology}{', ' + model if with_model else ''})"


def max_n_sentences(rows: pd.DataFrame, baseline_max_n: int | None) -> list[str]:
    """One sentence per (hardware, model, workflow, topology): max N per cp, ratios to cp=1 and baseline.

    cp=1 is the same computation whatever the topology: a topology without a cp=1 probe of its
    own is compared against the cp=1 probe of another topology (the sentence names it)."""
    rows = ensure_hardware(rows)
    fits = rows[(rows["row"] == "max-fit") & rows["N_tokens"].notna()]
    if fits.empty:
        return ["No probe found a max N in these results."]
    several = several_hardware(fits)
    with_model = fits["model"].nunique() > 1 or several
    out, any_lower, any_unstable = [], False, False
    baselines = stock_baselines(rows)
    for (hardware, model, workflow), same_wf in fits.groupby([HARDWARE, "model", "workflow"], sort=True):
        cp1_any = best_fit_per_cp(same_wf[same_wf["cp"] == 1])
        # the stock single-GPU baseline of this workflow, unless the user gave one or this is one
        stock = (None if baseline_max_n
                 else stock_baseline_for(same_wf, str(model), str(workflow), baselines, str(hardware)))
        model = with_hardware(str(model), hardware, several)
        for topology, grp in same_wf.groupby("topology", sort=True):
            best = best_fit_per_cp(grp)
            by_cp = dict(zip(best["cp"].astype(int), best["N_tokens"].astype(int)))
            lower = set(best.loc[is_lower_bound(best), "cp"].astype(int))
            unstable = set(best.loc[best["status"] == "unstable", "cp"].astype(int))
            any_lower = any_lower or bool(lower)
            any_unstable = any_unstable or bool(unstable)
            base_n, base_note, base_lower = by_cp.get(1), "", 1 in lower
            if base_n is None and not cp1_any.empty:  # cp=1 from another topology's probe
                base_n = int(cp1_any["N_tokens"].iloc[0])
                base_lower = bool(is_lower_bound(cp1_any).iloc[0])
                base_note = f" = {'≥ ' if base_lower else ''}{_n(base_n)} from the {cp1_any['topology'].iloc[0]} probe"
            parts = []
            for cp, max_n in by_cp.items():
                text = f"{'≥ ' if cp in lower else ''}{_n(max_n)}{' (unstable)' if cp in unstable else ''} at cp={cp}"
                if cp != 1 and base_n:
                    mark = ratio_mark(cp in lower, base_lower)
                    text += f" ({mark}{max_n / base_n:.2f}× cp=1{base_note}; ideal √{cp} = {math.sqrt(cp):.2f}×)"
                parts.append(text)
            label = _group_label(model, workflow, topology, with_model)
            sentence = f"{label[:1].upper() + label[1:]}: max N {', '.join(parts)}"
            if base_n is None:
                sentence += " (no cp=1 probe in these results to compare against)"
            if baseline_max_n:
                ratios = ", ".join(f"{by_cp[cp] / baseline_max_n:.2f}× at cp={cp}" for cp in by_cp)
                sentence += f"; against the user-supplied single-GPU baseline of {_n(baseline_max_n)}: {ratios}"
            out.append(sentence + ".")
            if stock is not None:
                out.append(stock_sentence(best, stock))
    if any_lower:
        out.append("≥ marks a lower bound: that probe was stopped early, no N ran out of memory "
                   "(nothing failed, or the first failure was a timeout or an error), or the out-of-memory "
                   f"lies more than {COARSE_GAP_TOKENS} tokens above it (a coarse bracket); a ratio is marked "
                   "≥, ≤ or ~ when its figure, its baseline or both are lower bounds.")
    if any_unstable:
        out.append("Unstable: a re-run of that max N, or of the N that failed above it, disagreed with its "
                   "first run (fit once and failed once), so it is not a reproducible limit.")
    return out


def stock_sentence(best: pd.DataFrame, stock: StockBaseline) -> str:
    """``1d cp=2 fits 16,384 tokens, 3.20× the stock Boltz-2 trunk on one GPU (5,120); ...``: each
    CP config's max N (``best``: one max-fit row per cp) against a stock model's single-GPU max N."""
    lower = is_lower_bound(best)
    parts = [f"{row['CP config']} fits {'≥ ' if low else ''}{_n(row['N_tokens'])} tokens, "
             f"{ratio_mark(bool(low), stock.lower_bound)}{int(row['N_tokens']) / stock.max_n:.2f}× {stock.phrase()}"
             for (_, row), low in zip(best.iterrows(), lower)]
    return "; ".join(parts) + "."


def walltime_sentences(rows: pd.DataFrame) -> list[str]:
    """Per (hardware, model, workflow): the fitted walltime exponent per CP config, and the cp speedup at
    the largest N all its CP configs share."""
    ok = with_kernel_labels(latest_ok_timing(ensure_hardware(rows)))
    if ok.empty:
        return []
    out = []
    several = several_hardware(ok)
    with_model, with_kernels = ok["model"].nunique() > 1 or several, ok["kernels"].nunique() > 1
    for (hardware, model, workflow, kernels), grp in ok.groupby([HARDWARE, "model", "workflow", "kernels"], sort=True):
        model = with_hardware(str(model), hardware, several)
        what = f"{workflow}, {model}" if with_model else workflow
        if with_kernels:  # the same points under several backends: a sentence per backend
            what += f", kernels={kernels or 'unknown'}"
        exps = []
        for cfg, g in grp.groupby("CP config", sort=True):
            k = walltime_exponent(g["N_tokens"].astype(float), g["walltime (ms)"].astype(float))
            if k is not None:
                exps.append(f"N^{k:.2f} at {cfg} (N {_n(g['N_tokens'].min())}–{_n(g['N_tokens'].max())})")
        if exps:
            out.append(f"{what[0].upper() + what[1:]} walltime grows as " + ", ".join(exps) + ".")
        base = grp[grp["cp"] == 1]
        common = set(base["N_tokens"])
        for cp in sorted(set(grp["cp"]) - {1}):
            common &= set(grp[grp["cp"] == cp]["N_tokens"])
        if common and grp["cp"].nunique() > 1:
            n = max(common)
            others = grp[(grp["N_tokens"] == n) & (grp["cp"] != 1)]
            at_n = others.groupby(["cp", "CP config"])["walltime (ms)"].median()
            t1 = base[base["N_tokens"] == n]["walltime (ms)"].median()
            ratios = [f"{cfg} {t:.1f} ms ({_speedup(t1, t)})" for (_, cfg), t in at_n.items()]
            out.append(f"At N={_n(n)} ({what}), cp=1 takes {t1:.1f} ms; " + ", ".join(ratios) + ".")
    repeated = repeated_timing_points(rows)
    if repeated:
        out.append(f"{repeated} timing point{'s were' if repeated > 1 else ' was'} measured more than once; "
                   "the readout and the plots use the latest measurement of each (the table keeps every row).")
    return out


def _speedup(cp1_ms: float, ms: float) -> str:
    """'1.97× faster than cp=1' or, when CP costs time, '1.10× slower than cp=1'."""
    return f"{cp1_ms / ms:.2f}× faster than cp=1" if ms <= cp1_ms else f"{ms / cp1_ms:.2f}× slower than cp=1"


def cost_sentences(rows: pd.DataFrame) -> list[str]:
    """Compute vs communication, only where communication time was measured."""
    ok = latest_ok_timing(rows)
    measured = ok[ok["comm share"].notna()] if "comm share" in ok else ok.iloc[0:0]
    if measured.empty:
        traffic = ok[ok["comm bytes/block"].notna() & (ok["cp"] > 1)] if "comm bytes/block" in ok else ok.iloc[0:0]
        note = ""
        if not traffic.empty:
            worst = traffic.loc[traffic["comm bytes/block"].astype(float).idxmax()]
            note = (f" Traffic was counted: up to {float(worst['comm bytes/block']) / 2**20:.1f} MiB per block "
                    f"per rank ({worst['CP config']}, N={_n(worst['N_tokens'])}).")
        return ["Communication time was not measured in these results, so whether compute or "
                "communication dominates is not stated." + note]
    share = measured.groupby(["workflow", "CP config"], sort=True)["comm share"].mean()
    parts = [f"{100 * s:.0f} % at {cfg} ({wf})" for (wf, cfg), s in share.items()]
    worst = float(share.max())
    verdict = "communication dominates" if worst > 0.5 else "compute dominates"
    return [f"Communication takes {', '.join(parts)} of the measured stage time, so {verdict}"
            + (" at the largest share." if worst > 0.5 else " everywhere measured.")]


def mfu_sentences(rows: pd.DataFrame) -> list[str]:
    if "MFU" not in rows or rows["MFU"].notna().sum() == 0:
        return []
    best = rows.loc[rows["MFU"].astype(float).idxmax()]
    return [f"Best MFU {100 * float(best['MFU']):.1f} % ({float(best['TFLOP/s/GPU']):.0f} TFLOP/s per GPU; "
            f"{best['workflow']}, {best['CP config']}, N={_n(best['N_tokens'])})."]


def coverage_sentences(rows: pd.DataFrame) -> list[str]:
    """Which CP sizes were measured (some row finished ok) and which were not, with why (the
    statuses of their rows; ``insufficient_gpus``: the GPUs they need)."""
    if "cp" not in rows or rows["cp"].notna().sum() == 0:
        return []
    known = rows[rows["cp"].notna()]
    cps = sorted(set(known["cp"].astype(int)))
    measured = sorted(set(known.loc[known["status"].isin(["ok", "unstable"]), "cp"].astype(int)))
    missing = [cp for cp in cps if cp not in measured]
    if not missing:
        return [f"CP sizes measured: {', '.join(map(str, measured))}."] if len(cps) > 1 else []
    why = []
    for cp in missing:
        statuses = sorted(set(known.loc[known["cp"].astype(int) == cp, "status"].astype(str)))
        reason = f"needs {cp} GPUs" if statuses == ["insufficient_gpus"] else "/".join(statuses)
        why.append(f"cp={cp} ({reason})")
    head = f"CP sizes measured: {', '.join(map(str, measured))}; " if measured else "No CP size was measured; "
    tail = (" (their rows carry the command that runs them under SLURM)"
            if any("insufficient_gpus" in w or "GPUs" in w for w in why) else "")
    return [head + f"not measured: {', '.join(why)}{tail}."]


def failure_sentences(rows: pd.DataFrame) -> list[str]:
    failed = rows[rows["status"] != "ok"]
    if failed.empty:
        return [f"All {len(rows)} jobs finished ok."]
    counts = ", ".join(f"{n} {status}" for status, n in failed["status"].value_counts().sort_index().items())
    return [f"{len(failed)} of {len(rows)} jobs did not finish ok ({counts}); their rows stay in the table."]


def readout(rows: pd.DataFrame, baseline_max_n: int | None = None) -> str:
    """The one-paragraph readout of the whole report."""
    if rows.empty:
        return "No result.json was found, so there is nothing to read out."
    return " ".join(max_n_sentences(rows, baseline_max_n) + walltime_sentences(rows) + cost_sentences(rows)
                    + mfu_sentences(rows) + coverage_sentences(rows) + failure_sentences(rows))
