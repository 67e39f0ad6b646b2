"""The report's plots (matplotlib, Agg): PNG files beside the markdown that links them.

Each ``plot_*`` takes the report's frames (``cpbench.report.rows``), writes one PNG and returns
None, or returns the reason it was skipped (data absent) without writing anything:

* ``max_n``: max N vs cp per topology and workflow, with the ideal √cp line from the smallest cp;
* ``walltime``: median walltime vs N on log axes, with the fitted exponent per CP config;
* ``memory``: per-rank peak memory vs N with the fitted a·N² + b·N + c per CP config;
* ``comm``: the communication share of the step per CP config.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # files only: benchmarks run on headless nodes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from cpbench.report.analysis import best_fit_per_cp, latest_ok_timing, memory_points, walltime_exponent  # noqa: E402
from cpbench.report.memory_model import fit_peak_memory  # noqa: E402


def _series_label(keys: tuple, with_model: bool) -> str:
    model, *rest = keys
    return " ".join(([str(model)] if with_model else []) + [str(k) for k in rest])


def _finish(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """Label, grid and legend of a line plot, then save it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_max_n(rows: pd.DataFrame, path: Path) -> str | None:
    """Max N vs cp for each (model, workflow, topology), with ideal √cp scaling dashed."""
    fits = rows[(rows["row"] == "max-fit") & rows["N_tokens"].notna()] if not rows.empty else rows
    if fits.empty:
        return "no probe result with a max N"
    with_model = fits["model"].nunique() > 1
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, (keys, grp) in enumerate(fits.groupby(["model", "workflow", "topology"], sort=True)):
        best = best_fit_per_cp(grp)
        cps, max_n = best["cp"].astype(float).to_numpy(), best["N_tokens"].astype(float).to_numpy()
        color = f"C{i % 10}"
        ax.plot(cps, max_n, "o-", color=color, label=_series_label(keys, with_model))
        ideal_cp = np.geomspace(cps[0], max(cps[-1], cps[0] * 2), 20)
        ax.plot(ideal_cp, max_n[0] * np.sqrt(ideal_cp / cps[0]), "--", color=color, alpha=0.5,
                label=f"ideal √cp from cp={int(cps[0])}")
    ax.set_xscale("log", base=2)
    _finish(fig, ax, path, "CP size (GPUs)", "max N (tokens)", "Max N that fits vs CP size")
    return None


def plot_walltime(rows: pd.DataFrame, path: Path) -> str | None:
    """Median walltime vs N (log-log) per (model, workflow, CP config), fitted exponent in the legend."""
    ok = latest_ok_timing(rows)
    groups = [(k, g) for k, g in ok.groupby(["model", "workflow", "CP config"], sort=True)
              if g["N_tokens"].nunique() >= 2] if not ok.empty else []
    if not groups:
        return "needs ok timing results at 2 or more N for one CP config"
    with_model = ok["model"].nunique() > 1
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
    """Per-rank peak memory vs N per (model, workflow, CP config), with its quadratic fit."""
    data = memory_points(rows, points)
    if data.empty:
        return "no peak memory measured at a point that fit"
    with_model = data["model"].nunique() > 1
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, (keys, grp) in enumerate(data.groupby(["model", "workflow", "CP config"], sort=True)):
        n, peak = grp["N"].astype(float).to_numpy(), grp["peak_gib"].astype(float).to_numpy()
        color = f"C{i % 10}"
        fit = fit_peak_memory(n, peak, cp=int(grp["cp"].iloc[0]))
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


# name -> (title, function(rows, points, path)); the order is the report's.
PLOTS: dict[str, tuple[str, Callable[[pd.DataFrame, pd.DataFrame, Path], str | None]]] = {
    "max_n": ("Max N vs CP size", lambda rows, points, path: plot_max_n(rows, path)),
    "walltime": ("Walltime vs N", lambda rows, points, path: plot_walltime(rows, path)),
    "memory": ("Peak memory vs N", plot_memory),
    "comm": ("Communication share", lambda rows, points, path: plot_comm_share(rows, path)),
}


def write_plots(rows: pd.DataFrame, points: pd.DataFrame, out_dir: Path,
                stem: str) -> list[tuple[str, str, Path | None, str | None]]:
    """Write every plot as ``out_dir/{stem}_{name}.png``.

    Returns:
        ``[(name, title, path or None, reason skipped or None)]`` in report order.
    """
    out = []
    for name, (title, fn) in PLOTS.items():
        path = out_dir / f"{stem}_{name}.png"
        path.unlink(missing_ok=True)  # a stale plot from an earlier build must not be linked
        reason = fn(rows, points, path)
        out.append((name, title, None if reason else path, reason))
    return out
