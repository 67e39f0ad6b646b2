"""What the report derives from its frames before it writes anything: the timing points to read
(the latest of each), the best max-fit per cp, the walltime exponent, the memory points.

The readout and the plots both read these, so a figure in the text and in a plot is the same.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def walltime_exponent(n_tokens, walltime_ms) -> float | None:
    """Slope k of log(walltime) vs log(N), i.e. walltime ∝ N^k; None with under 2 distinct N."""
    n = np.asarray(n_tokens, dtype=float)
    t = np.asarray(walltime_ms, dtype=float)
    if np.unique(n).size < 2:
        return None
    return float(np.polyfit(np.log(n), np.log(t), 1)[0])


TIMING_POINT = ["model", "workflow", "CP config", "N_tokens"]


def ok_timing(rows: pd.DataFrame) -> pd.DataFrame:
    if rows.empty:
        return rows
    return rows[(rows["row"] == "timing") & (rows["status"] == "ok") & rows["walltime (ms)"].notna()]


def latest_ok_timing(rows: pd.DataFrame) -> pd.DataFrame:
    """The ok timing rows, the latest (by ``date``) of each point (model, workflow, CP config,
    N) measured more than once: a rerun after a code change replaces the older figure in the
    plots and the readout, instead of being averaged with it (the table keeps every row)."""
    ok = ok_timing(rows)
    if "date" not in ok:
        return ok
    order = ok.assign(_date=ok["date"].fillna("")).sort_values("_date", kind="stable")
    return order.drop_duplicates(TIMING_POINT, keep="last").drop(columns="_date").sort_index()


def repeated_timing_points(rows: pd.DataFrame) -> int:
    """How many timing points have more than one ok row (``latest_ok_timing`` keeps one of each)."""
    ok = ok_timing(rows)
    return 0 if ok.empty else int((ok.groupby(TIMING_POINT).size() > 1).sum())


def best_fit_per_cp(fits: pd.DataFrame) -> pd.DataFrame:
    """The max-fit row with the largest N of each cp, ordered by cp: one figure per cp when a
    cp was probed several times (a probe stopped early and its rerun, say)."""
    return fits.loc[fits.groupby("cp")["N_tokens"].idxmax()].sort_values("cp")


def memory_points(rows: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """Every (N, per-rank peak) measured where the step fit: ok timing rows and fitting probe points."""
    frames = []
    ok = latest_ok_timing(rows)
    if not ok.empty:
        frames.append(ok[["model", "workflow", "CP config", "cp", "N_tokens", "peak_mem (GiB)"]]
                      .rename(columns={"N_tokens": "N", "peak_mem (GiB)": "peak_gib"}))
    if not points.empty:
        fit = points[points["fits"]]
        frames.append(fit[["model", "workflow", "CP config", "cp", "N", "peak_alloc_gib"]]
                      .rename(columns={"peak_alloc_gib": "peak_gib"}))
    if not frames:
        return pd.DataFrame(columns=["model", "workflow", "CP config", "cp", "N", "peak_gib"])
    out = pd.concat(frames, ignore_index=True)
    return out[out["peak_gib"].notna() & out["N"].notna()]
