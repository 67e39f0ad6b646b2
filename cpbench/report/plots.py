"""The report's plots (matplotlib, Agg): PNG files beside the markdown that links them.

Each ``plot_*`` takes the report's frames (``cpbench.report.rows``), writes one PNG and returns
None, or returns the reason it was skipped (data absent) without writing anything:

* ``max_n``: the CP curve, max N vs cp, a panel per workflow, a line per topology (emulated series
  apart, dotted), with the ideal √cp line from cp=1; an OOM bracket as an error bar, a lower
  bound as an open marker with an arrow up;
* ``walltime``: median walltime vs N on log axes, with the fitted exponent per CP config;
* ``memory``: per-rank peak memory vs N with the fitted a·N² + b·N + c per CP config;
* ``comm``: the communication share of the step per CP config;
* ``stage_peak``: per-stage peak allocated memory (``stats.stage_peak_gib``) per timing point and
  per probe's point at max N, one stacked bar per point: its stages in the order of their peaks,
  each segment how far that stage's peak rises above the next lower one. Stage peaks nest (the
  trunk's includes the embedding's), so the bar's height is the point's peak and its top segment
  names the stage that sets it (for a probe: the stage that sets the max N).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # files only: benchmarks run on headless nodes
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from cpbench.report.analysis import (  # noqa: E402
    TIMING_SERIES,
    best_fit,
    best_fit_per_cp,
    fitting_subset,
    latest_ok_timing,
    memory_points,
    walltime_exponent,
    with_kernel_labels,
)
from cpbench.report.readout import is_lower_bound  # noqa: E402
from cpbench.report.rows import STAGE_PEAK_PREFIX, ensure_hardware, hardware_in_model, several_hardware  # noqa: E402
from cpbench.results.memory_fit import fit_peak_memory  # noqa: E402


def _series_label(keys: tuple, with_model: bool) -> str:
    model, *rest = keys
    return " ".join(([str(model)] if with_model else []) + [str(k) for k in rest if str(k)])


def _finish(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """Label, grid and legend of a line plot, then save it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    """Save ``fig``; the tight bounding box keeps a legend that the layout cannot fit (many series)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tight layout not applied")
        fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_max_n(rows: pd.DataFrame, path: Path) -> str | None:
    """The CP curve: max N vs cp, one panel per workflow (inference with and without sampling
    share one), a line per (model, workflow, topology, measured or emulated), and the ideal √cp
    line from the cp=1 max N of the same model and workflow (else the series' smallest cp). A
    max N bounded by an out-of-memory is a filled marker with an error bar up to the first failing
    N; a lower bound (``readout.is_lower_bound``) an open marker with an arrow pointing up.
    Emulated series (``emulate=true``) are dotted with square markers and say so in the legend."""
    fits = rows[(rows["row"] == "max-fit") & rows["N_tokens"].notna()] if not rows.empty else rows
    if fits.empty:
        return "no probe result with a max N"
    fits = fits.assign(emulated=fits["emulated"].fillna(False).astype(bool) if "emulated" in fits else False)
    with_model = fits["model"].nunique() > 1
    panels = sorted(fits["workflow"].astype(str).str.split("+").str[0].unique())
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.6), squeeze=False)
    series = 0
    for ax, panel in zip(axes[0], panels):
        in_panel = fits[fits["workflow"].astype(str).str.split("+").str[0] == panel]
        groups = list(in_panel.groupby(["model", "workflow", "topology", "emulated"], sort=True))
        tips = []
        for i, ((model, workflow, topology, emulated), grp) in enumerate(groups):
            # a small shift along cp (log scale) keeps series at the same (cp, N) apart
            shift = 2 ** (0.04 * (i - (len(groups) - 1) / 2))
            same = in_panel[(in_panel["model"] == model) & (in_panel["workflow"] == workflow)]
            cp1 = best_fit_per_cp(same[(same["cp"] == 1) & ~same["emulated"]])
            anchor = float(cp1["N_tokens"].iloc[0]) if not cp1.empty else None
            label = _series_label((model, workflow, topology, "emulated" if emulated else ""), with_model)
            tips += _max_n_series(ax, best_fit_per_cp(grp), f"C{series % 10}", label, shift, bool(emulated), anchor)
            series += 1
        if tips:
            ax.set_ylim(top=max(ax.get_ylim()[1], 1.03 * max(tips)))
        ax.set_xscale("log", base=2)
        ax.set_title(f"{panel}: the CP curve (max N that fits vs CP size)", fontsize=10)
        ax.set_xlabel("CP size (GPUs)")
        ax.set_ylabel("max N (tokens)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.text(0.01, 0.01, "filled: bounded by an OOM (bar up to the first failing N); open + arrow: a lower bound; "
             "dotted squares: emulated (rank 0 of cp=K alone, emulate=true)", fontsize=7, alpha=0.8)
    _save(fig, path)
    return None


def _max_n_series(ax, best: pd.DataFrame, color: str, label: str, shift: float = 1.0, emulated: bool = False,
                  cp1_max_n: float | None = None) -> list[float]:
    """One line of ``plot_max_n``: markers by bound, the OOM bracket, the ideal √cp line (from
    ``cp1_max_n`` at cp=1 where given, else from the series' smallest cp), each cp drawn at
    ``cp·shift``; returns the tips of its lower-bound arrows."""
    cps = best["cp"].astype(float).to_numpy() * shift
    max_n = best["N_tokens"].astype(float).to_numpy()
    lower = is_lower_bound(best).to_numpy()
    marker = "s" if emulated else "o"
    ax.plot(cps, max_n, ":" if emulated else "-", color=color, label=label)
    exact = ~lower
    if exact.any():
        fail = pd.to_numeric(best["first_fail_n"], errors="coerce").astype(float).to_numpy()
        above = np.where(np.isnan(fail), 0.0, fail - max_n)[exact]
        ax.errorbar(cps[exact], max_n[exact], yerr=[np.zeros_like(above), above], fmt=marker, color=color,
                    capsize=4, markersize=6)
    tips = []
    for cp, n in zip(cps[lower], max_n[lower]):
        ax.plot([cp], [n], marker, markerfacecolor="none", markeredgecolor=color, markersize=7)
        tips.append(n * 1.12)
        ax.annotate("", xy=(cp, tips[-1]), xytext=(cp, n), arrowprops={"arrowstyle": "->", "color": color})
    base_cp, base_n = (shift, cp1_max_n) if cp1_max_n else (cps[0], max_n[0])
    ideal_cp = np.geomspace(base_cp, max(cps[-1], base_cp * 2), 20)
    ax.plot(ideal_cp, base_n * np.sqrt(ideal_cp / base_cp), "--", color=color, alpha=0.5,
            label=f"ideal √cp from cp={round(base_cp / shift)}")
    return tips


def plot_walltime(rows: pd.DataFrame, path: Path) -> str | None:
    """Median walltime vs N (log-log) per (model, workflow, CP config, kernel backend), fitted
    exponent in the legend (the backend named where several ran)."""
    ok = with_kernel_labels(latest_ok_timing(ensure_hardware(rows)))
    # a series' hardware is in its model label (write_plots: hardware_in_model) where several ran
    groups = [(k[1:], g) for k, g in ok.groupby(TIMING_SERIES, sort=True)
              if g["N_tokens"].nunique() >= 2] if not ok.empty else []
    if not groups:
        return "needs ok timing results at 2 or more N for one CP config"
    with_model = ok["model"].nunique() > 1
    if ok["kernels"].nunique() <= 1:  # name the backend only where several ran
        groups = [(keys[:-1], grp) for keys, grp in groups]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, (keys, grp) in enumerate(groups):
        grp = grp.sort_values("N_tokens")
        n, t = grp["N_tokens"].astype(float).to_numpy(), grp["walltime (ms)"].astype(float).to_numpy()
        k = walltime_exponent(n, t)
        ax.plot(n, t, "o-", color=f"C{i % 10}", label=f"{_series_label(keys, with_model)}: ∝ N^{k:.2f}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _finish(fig, ax, path, "N (tokens)", "median walltime (ms)", "Walltime vs N")
    return None


def plot_memory(rows: pd.DataFrame, points: pd.DataFrame, path: Path) -> str | None:
    """Per-rank peak memory vs N per (model, workflow, CP config), with its quadratic fit (over the
    group's lean points where it has enough: ``analysis.fitting_subset``)."""
    data = memory_points(ensure_hardware(rows), ensure_hardware(points))
    if data.empty:
        return "no peak memory measured at a point that fit"
    with_model = data["model"].nunique() > 1
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, (keys, grp) in enumerate(data.groupby(["model", "workflow", "CP config"], sort=True)):
        n, peak = grp["N"].astype(float).to_numpy(), grp["peak_gib"].astype(float).to_numpy()
        color = f"C{i % 10}"
        fitted = fitting_subset(grp)
        fit = fit_peak_memory(fitted["N"].astype(float).to_numpy(), fitted["peak_gib"].astype(float).to_numpy(),
                              cp=int(grp["cp"].iloc[0]))
        ax.plot(n, peak, "o", color=color, label=f"{_series_label(keys, with_model)}: {fit.form}")
        grid = np.geomspace(n.min(), n.max(), 50) if n.max() > n.min() else n
        ax.plot(grid, [fit.predict_gib(x) for x in grid], "-", color=color, alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _finish(fig, ax, path, "N (tokens)", "per-rank peak memory (GiB)", "Peak memory vs N (fit a·N²+b·N+c)")
    return None


def plot_comm_share(rows: pd.DataFrame, path: Path) -> str | None:
    """Communication share of the step per CP config (mean over the N measured)."""
    ok = latest_ok_timing(rows)
    if ok.empty or "comm share" not in ok or ok["comm share"].notna().sum() == 0:
        return "no result carries a measured communication time (adapter stats)"
    share = ok[ok["comm share"].notna()].groupby(["workflow", "CP config"], sort=True)["comm share"].mean()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    labels = [f"{wf}\n{cfg}" for wf, cfg in share.index]
    ax.bar(range(len(share)), 100 * share.to_numpy(), color=[f"C{i % 10}" for i in range(len(share))])
    ax.set_xticks(range(len(share)), labels, fontsize=8)
    ax.set_ylabel("communication share of step (%)")
    ax.set_ylim(0, max(5.0, math.ceil(100 * float(share.max()) / 10) * 10))
    ax.set_title("Communication share per CP config")
    ax.grid(True, axis="y", alpha=0.3)
    _save(fig, path)
    return None


def plot_stage_peak(rows: pd.DataFrame, path: Path) -> str | None:
    """Per-stage peak allocated memory per point (see the module docstring): the latest of each
    timing point and each configuration's max-N point, a stacked bar of sorted increments each."""
    skipped = "no result carries per-stage peak memory (adapter stats stage_peak_gib, CUDA only)"
    fits = rows[(rows["row"] == "max-fit") & rows["N_tokens"].notna()] if not rows.empty else rows
    fits = (pd.concat([best_fit(grp) for _, grp in fits.groupby(["model", "workflow", "CP config"])])
            if not fits.empty else fits)
    data = pd.concat([frame for frame in (latest_ok_timing(rows), fits) if not frame.empty] or [rows.iloc[0:0]])
    stages = [c for c in data.columns if c.startswith(STAGE_PEAK_PREFIX)]
    if not stages:
        return skipped
    data = data[data[stages].notna().any(axis=1)].sort_values(["model", "workflow", "CP config", "row", "N_tokens"])
    if data.empty:
        return skipped
    colors = {col: f"C{j % 10}" for j, col in enumerate(stages)}
    fig, ax = plt.subplots(figsize=(max(6.4, 0.9 * len(data) + 2), 4.4))
    for i, (_, r) in enumerate(data.iterrows()):
        bottom = 0.0
        for gib, col in sorted((float(r[c]), c) for c in stages if pd.notna(r[c])):
            ax.bar(i, gib - bottom, 0.6, bottom=bottom, color=colors[col])
            bottom = gib
    several_kernels = "kernels" in data and data["kernels"].fillna("").nunique() > 1
    labels = [f"{r['workflow']}\n{r['CP config']}"
              + (f" {r['kernels']}" if several_kernels and isinstance(r.get("kernels"), str) else "")
              + f"\n{'max N' if r['row'] == 'max-fit' else 'N'}={int(r['N_tokens'])}" for _, r in data.iterrows()]
    ax.set_xticks(range(len(data)), labels, fontsize=7)
    ax.set_ylabel("peak allocated (GiB, largest rank)")
    ax.set_title("Peak memory per stage: each segment is how far that stage's peak\n"
                 "rises above the next lower one; the top one sets the point's peak", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    handles = [matplotlib.patches.Patch(color=colors[c], label=c[len(STAGE_PEAK_PREFIX):]) for c in stages]
    ax.legend(handles=handles, fontsize=8)
    _save(fig, path)
    return None


# name -> (title, function(rows, points, path)); the order is the report's.
PLOTS: dict[str, tuple[str, Callable[[pd.DataFrame, pd.DataFrame, Path], str | None]]] = {
    "max_n": ("Max N vs CP size", lambda rows, points, path: plot_max_n(rows, path)),
    "walltime": ("Walltime vs N", lambda rows, points, path: plot_walltime(rows, path)),
    "memory": ("Peak memory vs N", plot_memory),
    "comm": ("Communication share", lambda rows, points, path: plot_comm_share(rows, path)),
    "stage_peak": ("Peak memory per stage", lambda rows, points, path: plot_stage_peak(rows, path)),
}


def write_plots(rows: pd.DataFrame, points: pd.DataFrame, out_dir: Path,
                stem: str) -> list[tuple[str, str, Path | None, str | None]]:
    """Write every plot as ``out_dir/{stem}_{name}.png``.

    Returns:
        ``[(name, title, path or None, reason skipped or None)]`` in report order.
    """
    rows, points = ensure_hardware(rows), ensure_hardware(points)
    several = several_hardware(rows)
    rows, points = hardware_in_model(rows, several), hardware_in_model(points, several)
    out = []
    for name, (title, fn) in PLOTS.items():
        path = out_dir / f"{stem}_{name}.png"
        path.unlink(missing_ok=True)  # a stale plot from an earlier build must not be linked
        reason = fn(rows, points, path)
        out.append((name, title, None if reason else path, reason))
    return out
