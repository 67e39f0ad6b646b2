"""What the report derives from its frames before it writes anything: the timing points to read
(the latest of each), the best max-fit per cp, whether a max N is only a lower bound, the stock
single-GPU baselines, the walltime exponent, the memory points.

The readout and the plots both read these, so a figure in the text and in a plot is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from cpbench.report.rows import HARDWARE, ensure_hardware
from cpbench.results import INCOMPLETE
from cpbench.results.memory_fit import MIN_LEAN_POINTS


def walltime_exponent(n_tokens, walltime_ms) -> float | None:
    """Slope k of log(walltime) vs log(N), i.e. walltime ∝ N^k; None with under 2 distinct N."""
    n = np.asarray(n_tokens, dtype=float)
    t = np.asarray(walltime_ms, dtype=float)
    if np.unique(n).size < 2:
        return None
    return float(np.polyfit(np.log(n), np.log(t), 1)[0])


TIMING_POINT = [HARDWARE, "model", "workflow", "CP config", "N_tokens"]
# A timing series: the points of one walltime curve. The kernel backend is part of it (one run may
# time the same point under flex and torch: neither replaces the other).
TIMING_SERIES = [HARDWARE, "model", "workflow", "CP config", "kernels"]


# What names a timing point: its series and N.
TIMING_POINT_KEYS = [*TIMING_POINT, "kernels"]


def with_kernel_labels(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a ``kernels`` column, "" where the backend is unknown (so that grouping by
    it keeps those rows)."""
    return frame.assign(kernels=frame["kernels"].fillna("") if "kernels" in frame else "")


def _point_key(ok: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The ``keys`` columns of ``ok`` as text: an unknown backend (None) or a column the frame
    lacks is a value ("") like any other, not a row that grouping drops."""
    key = ok.reindex(columns=keys).astype(object)
    return key.where(key.notna(), "").astype(str)


def ok_timing(rows: pd.DataFrame) -> pd.DataFrame:
    if rows.empty:
        return rows
    return rows[(rows["row"] == "timing") & (rows["status"] == "ok") & rows["walltime (ms)"].notna()]


def latest_ok_timing(rows: pd.DataFrame, point_keys: list[str] | None = None) -> pd.DataFrame:
    """The ok timing rows, the latest (by ``date``) of each point measured more than once: a
    rerun after a code change replaces the older figure in the plots and the readout, instead of
    being averaged with it (the table keeps every row). A point is ``point_keys`` (default
    ``TIMING_POINT_KEYS``: hardware, model, workflow, CP config, N and kernel backend, so the same N under
    another backend is another point; the estimate adds the dtype)."""
    ok = ok_timing(rows)
    if ok.empty or "date" not in ok:
        return ok
    keys = list(point_keys or TIMING_POINT_KEYS)
    order = _point_key(ok, keys).assign(_date=ok["date"].fillna("")).sort_values("_date", kind="stable")
    return ok.loc[sorted(order.drop_duplicates(keys, keep="last").index)]


def repeated_timing_points(rows: pd.DataFrame) -> int:
    """How many timing points have more than one ok row (``latest_ok_timing`` keeps one of each)."""
    ok = ok_timing(rows)
    return 0 if ok.empty else int((_point_key(ok, TIMING_POINT_KEYS).groupby(TIMING_POINT_KEYS).size() > 1).sum())


def best_fit(fits: pd.DataFrame) -> pd.DataFrame:
    """The one max-fit row of a configuration probed several times (a probe stopped early and
    its rerun, say): the largest N, and of rows with that N the exact figure over a lower bound
    (a verified max N beside an older probe that reached the same N without a failure)."""
    ranked = fits.assign(_n=fits["N_tokens"].astype(int), _lower=is_lower_bound(fits))
    ranked = ranked.sort_values(["_n", "_lower"], ascending=[False, True], kind="stable")
    return fits.loc[[ranked.index[0]]]


def best_fit_per_cp(fits: pd.DataFrame) -> pd.DataFrame:
    """``best_fit`` of each cp, ordered by cp: one figure per cp."""
    if fits.empty:
        return fits
    return pd.concat([best_fit(grp) for _, grp in fits.groupby("cp")]).sort_values("cp")


# An out-of-memory more than this many tokens above a max N leaves the limit anywhere in between:
# such a figure is a lower bound too ("coarse"), the exactness the GPU probes are held to.
COARSE_GAP_TOKENS = 512


def is_lower_bound(fits: pd.DataFrame) -> pd.Series:
    """Max-fit rows whose N is only a lower bound of the max N: the probe was stopped early
    (``incomplete``), its first failure was not an out-of-memory (none, a timeout, an error),
    a point timed out, its verification disagreed (``unstable``; ``lower_bound`` of
    ``cpbench.report.rows`` where the rows carry it), or its out-of-memory lies more than
    ``COARSE_GAP_TOKENS`` above it (``coarse_gap``)."""
    cause = fits["first_fail_status"] if "first_fail_status" in fits else pd.Series(None, index=fits.index)
    bound = fits["lower_bound"].notna() if "lower_bound" in fits else False
    return (fits["status"].isin([INCOMPLETE, "unstable"])) | (cause.fillna("") != "oom") | bound | coarse_gap(fits)


def coarse_gap(fits: pd.DataFrame) -> pd.Series:
    """Max-fit rows whose first failing N is more than ``COARSE_GAP_TOKENS`` above their N."""
    if "first_fail_n" not in fits:
        return pd.Series(False, index=fits.index)
    gap = pd.to_numeric(fits["first_fail_n"], errors="coerce") - pd.to_numeric(fits["N_tokens"], errors="coerce")
    return gap.fillna(0) > COARSE_GAP_TOKENS



def ratio_mark(lower_bound: bool, baseline_lower_bound: bool) -> str:
    """The mark before a ratio of two max N: ``≥`` when only the figure is a lower bound, ``≤`` when
    only its baseline is, ``~`` when both are."""
    return {(True, False): "≥ ", (False, True): "≤ ", (True, True): "~ "}.get((lower_bound, baseline_lower_bound), "")


@dataclass(frozen=True)
class StockBaseline:
    """A stock model's single-GPU max N for one workflow (``model=stock/*``, rows with ``stock`` set)."""

    title: str          # "Boltz-2"
    model: str          # its rows' model label, "stock-boltz2"
    workflow: str
    max_n: int
    lower_bound: bool   # the stock probe's max N only bounds it from below
    hardware: str = ""  # the GPU it ran on (rows.HARDWARE)

    def phrase(self) -> str:
        """``the stock Boltz-2 trunk on one GPU (5,120)``; ``≥ 5,120`` for a lower bound."""
        return f"the stock {self.title} trunk on one GPU ({'≥ ' if self.lower_bound else ''}{self.max_n:,})"


def stock_baselines(rows: pd.DataFrame) -> dict[tuple[str, str], list[StockBaseline]]:
    """Per (hardware, workflow label): each stock model's cp=1 max N (the largest of its probes), by model."""
    if rows.empty or "stock" not in rows:
        return {}
    fits = rows[(rows["row"] == "max-fit") & rows["N_tokens"].notna() & rows["stock"].notna() & (rows["cp"] == 1)]
    fits = ensure_hardware(fits)
    out: dict[tuple[str, str], list[StockBaseline]] = {}
    for (hardware, model, workflow), grp in fits.groupby([HARDWARE, "model", "workflow"], sort=True):
        best = best_fit(grp)
        out.setdefault((str(hardware), str(workflow)), []).append(StockBaseline(
            str(best["stock"].iloc[0]), str(model), str(workflow), int(best["N_tokens"].iloc[0]),
            bool(is_lower_bound(best).iloc[0]), str(hardware)))
    return out


def stock_baseline_for(same_wf: pd.DataFrame, model: str, workflow: str,
                       baselines: dict[tuple[str, str], list[StockBaseline]], hardware: str = "") -> StockBaseline | None:
    """The stock baseline the rows ``same_wf`` (one model, one workflow, on ``hardware``) are
    compared with: None when they are a stock model's own; else the stock trunk of the same name
    (``boltz2`` -> ``stock-boltz2``) where ``baselines`` (``stock_baselines``) hold it for
    ``workflow`` on the same hardware, else the first by name there."""
    if "stock" in same_wf and bool(same_wf["stock"].notna().any()):
        return None
    baselines = baselines.get((hardware, workflow), [])
    if not baselines:
        return None
    named = [b for b in baselines if b.model.endswith(f"-{model}")]
    return (named or baselines)[0]


def memory_points(rows: pd.DataFrame, points: pd.DataFrame,
                  group_keys: tuple[str, ...] = (HARDWARE, "model", "workflow", "CP config"),
                  point_keys: list[str] | None = None) -> pd.DataFrame:
    """Every (N, per-rank peak) measured where the step fit: ok timing rows (``latest_ok_timing``
    with ``point_keys``) and fitting probe points, with their ``group_keys`` columns, ``cp`` and
    ``lean`` (a probe's lean fitting point; see ``fitting_subset``)."""
    frames = []
    ok = latest_ok_timing(rows, point_keys) if not rows.empty else rows
    if not ok.empty:
        frames.append(ok[[*group_keys, "cp", "N_tokens", "peak_mem (GiB)"]]
                      .rename(columns={"N_tokens": "N", "peak_mem (GiB)": "peak_gib"}).assign(lean=False))
    if not points.empty:
        fit = points[points["fits"]]
        lean = fit["lean"].fillna(False).astype(bool) if "lean" in fit else False
        frames.append(fit[[*group_keys, "cp", "N", "peak_alloc_gib"]]
                      .rename(columns={"peak_alloc_gib": "peak_gib"}).assign(lean=lean))
    if not frames:
        return pd.DataFrame(columns=[*group_keys, "cp", "N", "peak_gib", "lean"])
    out = pd.concat(frames, ignore_index=True)
    return out[out["peak_gib"].notna() & out["N"].notna()]


def fitting_subset(group: pd.DataFrame) -> pd.DataFrame:
    """The points of one group (``memory_points`` rows) a peak fit uses: its lean points alone
    where they cover ``MIN_LEAN_POINTS`` distinct N, as the probe's own prediction does
    (``memory_fit.fitting_points``: a lean peak does not depend on free memory, the others'
    chunk transients do, so a fit through both bends); else all of them."""
    lean = group[group["lean"].fillna(False).astype(bool)] if "lean" in group else group.iloc[0:0]
    return lean if lean["N"].nunique() >= MIN_LEAN_POINTS else group
