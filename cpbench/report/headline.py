"""The headline: max N per model × workflow × CP config, against a baseline, as data and as text.

``headline_rows`` owns the figures (the largest measured max N of each configuration, whether it
is only a lower bound and why, the baseline and the ratio); ``headline_section`` writes them as
the report's "Headline" table, and ``cpbench.report.readme`` as the README's results table.

Baseline: ``report.baseline_max_n`` when given; else, where the results hold a stock model's
probe of the same workflow (``model=stock/*``: ``analysis.stock_baselines``), that single-GPU max N
for every configuration of the other models, cp=1 included; else the largest cp=1 max N of the
same model and workflow (any topology: cp=1 is the same computation in 1d and 2d).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from cpbench.report.analysis import (
    COARSE_GAP_TOKENS,
    best_fit,
    best_fit_per_cp,
    coarse_gap,
    is_lower_bound,
    ratio_mark,
    stock_baseline_for,
    stock_baselines,
)
from cpbench.report.rows import HARDWARE, day_of, ensure_hardware, with_hardware


@dataclass(frozen=True)
class HeadlineRow:
    """One configuration's max N; ``lower_bound`` says why it is only a lower bound (None: an
    out-of-memory bounds it from above)."""

    model: str
    workflow: str
    cp_config: str
    cp: int
    max_n: int
    lower_bound: str | None
    note: str                      # "OOM at 24,576", "timeout at 16,384", "stopped early", ...
    baseline_n: int | None = None
    baseline_name: str | None = None   # "cp=1" | "baseline" | "the stock Boltz-2 trunk on one GPU (5,120)"
    baseline_lower: bool = False
    command: str | None = None         # the command that made the figure (its record's overrides)
    hardware: str = ""                 # the GPU it ran on (rows.HARDWARE)

    @property
    def ratio(self) -> float | None:
        return self.max_n / self.baseline_n if self.baseline_n else None

    def max_n_text(self) -> str:
        return f"{'≥ ' if self.lower_bound else ''}{self.max_n:,}"

    def ratio_text(self) -> str | None:
        """``1.33× cp=1``; ``≥``/``≤``/``~`` when the figure or its baseline is a lower bound."""
        if self.ratio is None:
            return None
        return f"{ratio_mark(bool(self.lower_bound), self.baseline_lower)}{self.ratio:.2f}× {self.baseline_name}"


def headline_rows(rows: pd.DataFrame, baseline_max_n: int | None = None) -> list[HeadlineRow]:
    """One ``HeadlineRow`` per (hardware, model, workflow, CP config) with a measured max N, ordered
    by hardware, model, workflow, cp and CP config; of several probes of one configuration,
    ``best_fit``. A ratio compares figures of one hardware only."""
    if rows.empty:
        return []
    rows = ensure_hardware(rows)
    fits = rows[(rows["row"] == "max-fit") & rows["N_tokens"].notna()]
    baselines = stock_baselines(rows)
    out = []
    for (hardware, model, workflow), same_wf in fits.groupby([HARDWARE, "model", "workflow"], sort=True):
        cp1 = best_fit_per_cp(same_wf[same_wf["cp"] == 1])
        stock = stock_baseline_for(same_wf, str(model), str(workflow), baselines, str(hardware))
        for cp_config, grp in same_wf.groupby("CP config", sort=False):
            best = best_fit(grp)
            row = best.iloc[0]
            lower = bool(is_lower_bound(best).iloc[0])
            reason = _reason(row, bool(coarse_gap(best).iloc[0])) if lower else None
            baseline: dict = {}
            if baseline_max_n:
                baseline = {"baseline_n": int(baseline_max_n), "baseline_name": "baseline"}
            elif stock is not None:
                baseline = {"baseline_n": stock.max_n, "baseline_name": stock.phrase(),
                            "baseline_lower": stock.lower_bound}
            elif not cp1.empty and int(row["cp"]) != 1:
                baseline = {"baseline_n": int(cp1["N_tokens"].iloc[0]), "baseline_name": "cp=1",
                            "baseline_lower": bool(is_lower_bound(cp1).iloc[0])}
            note = _note(row, reason, measured_again(grp, best.index[0]))
            out.append(HeadlineRow(str(model), str(workflow), str(cp_config), int(row["cp"]), int(row["N_tokens"]),
                                   reason, note, command=row.get("command"), hardware=str(hardware), **baseline))
    return sorted(out, key=lambda h: (h.hardware, h.model, h.workflow, h.cp, h.cp_config))


def _reason(row, coarse: bool) -> str:
    reason = row.get("lower_bound")
    if isinstance(reason, str) and reason:
        return reason
    if row["status"] == "incomplete":
        return "stopped early"
    cause = row.get("first_fail_status")
    if cause == "oom" and coarse:
        return "coarse"
    return "no failure" if not isinstance(cause, str) else ("timeout" if cause == "timeout" else f"first failure {cause}")


def measured_again(grp: pd.DataFrame, best: object) -> set[int]:
    """The ends of row ``best``'s bracket that ``probe.verify`` did not re-run (``not_rerun``) but
    another probe of the same configuration measured with the same outcome: its max N (a fit) or
    its first failing N (an out-of-memory)."""
    ends = _not_rerun_ends(grp.loc[best])
    if not ends:
        return set()
    others = grp.drop(index=best)
    fits = {int(n) for n in others["N_tokens"].dropna()}
    ooms = {int(n) for n, cause in zip(others.get("first_fail_n", []), others.get("first_fail_status", []))
            if cause == "oom" and pd.notna(n)}
    fit_n, fail_n = int(grp.at[best, "N_tokens"]), _int_or_none(grp.at[best, "first_fail_n"])
    return {n for n in ends if (n == fit_n and n in fits) or (n == fail_n and n in ooms)}


def _not_rerun_ends(row) -> list[int]:
    """The ends of the bracket that ``probe.verify`` did not re-run: the row's ``not_rerun``
    (``"3,584 and 3,840"``, ``cpbench.report.rows.not_rerun``) as numbers."""
    missing = row.get("not_rerun")
    return [int(n.replace(",", "")) for n in missing.split(" and ")] if isinstance(missing, str) and missing else []


def _ns(ns: list[int]) -> str:
    return " and ".join(f"{n:,}" for n in sorted(ns))


def _note(row, reason: str | None, again: frozenset[int] | set[int] = frozenset()) -> str:
    """What bounds the figure: the out-of-memory above it, or why it is only a lower bound; for an
    exact figure, the ends of its bracket not re-run, or re-run only by another probe (``again``)."""
    timeout_n, fail_n = _int_or_none(row.get("timeout_n")), _int_or_none(row.get("first_fail_n"))
    if reason is None:
        ends = _not_rerun_ends(row)
        rerun = "".join(f"; {text}: {_ns(ns)}" for text, ns in
                        (("not re-run", [n for n in ends if n not in again]),
                         ("re-run by another probe", [n for n in ends if n in again])) if ns)
        return f"OOM at {fail_n:,}{rerun}" if fail_n else ""
    if reason == "coarse":
        return f"OOM at {fail_n:,}: a coarse bracket ({fail_n - int(row['N_tokens']):,} tokens)"
    if reason == "timeout":
        timeout_n = timeout_n or fail_n
        return f"timeout at {timeout_n:,}" if timeout_n else "a point timed out"
    if reason == "no failure":
        return "no N failed"
    if reason.startswith("first failure "):
        cause = reason.split(" ", 2)[2]
        return f"{cause} at {fail_n:,}" if fail_n else cause
    return reason  # "stopped early", "unstable"


def _int_or_none(value) -> int | None:
    try:
        return None if value is None or pd.isna(value) else int(value)
    except (TypeError, ValueError):
        return None


def headline_section(headline: list[HeadlineRow]) -> str:
    """The report's "Headline" section: one table row per configuration."""
    text = ["## Headline", ""]
    if not headline:
        return "\n".join(text + ["No probe found a max N in these results."])
    text += ["Max N per model, workflow and CP config (the largest measured where a configuration was "
             "probed more than once; of equal figures, an exact one before a lower bound). "
             "`≥`: a lower bound (the probe stopped early, no N ran out of memory, "
             f"a point timed out, a re-run disagreed: unstable, or the out-of-memory lies more than "
             f"{COARSE_GAP_TOKENS} tokens above: a coarse bracket). The ratio compares against "
             + _baseline_text(headline), "",
             "| model | workflow | CP config | max N | vs baseline | note |", "|---|---|---|---|---|---|"]
    several = len({h.hardware for h in headline}) > 1
    for h in headline:
        text.append(f"| {with_hardware(h.model, h.hardware, several)} | {h.workflow} | {h.cp_config} | "
                    f"{h.max_n_text()} | {h.ratio_text() or '—'} | "
                    f"{h.note or '—'} |")
    return "\n".join(text)


def _baseline_text(headline: list[HeadlineRow]) -> str:
    """What the Headline's ratios compare against (``headline_rows``' order of precedence)."""
    names = {h.baseline_name for h in headline if h.baseline_name}
    if "baseline" in names:
        return "the user-supplied baseline (`report.baseline_max_n`)."
    if any(name.startswith("the stock ") for name in names):
        return ("a stock model's single-GPU max N of the same workflow (`model=stock/*`, named in each cell); "
                "configurations without one, against the cp=1 probe of the same model and workflow.")
    return "the cp=1 probe of the same model and workflow (any topology)."


def run_context(records: list[dict], headline: list[HeadlineRow], routine: str | None = "probe") -> str:
    """``on NVIDIA H200 (2026-11-30, boltz2, bf16)``: where and when the probes behind the headline
    ran (the timing points, with ``routine="timing"``; every result with ``routine=None``)."""
    probes = [r for r in records if routine is None or r.get("routine") == routine]
    envs = [r.get("env") or {} for r in probes]
    gpus = sorted({str(e["gpu_model"]) for e in envs if e.get("gpu_model")})
    where = f"on {', '.join(gpus)}" if gpus else "on CPU"
    dates = sorted({day_of(e["date"]) for e in envs if e.get("date")})
    details = [dates[0] if len(dates) == 1 else f"{dates[0]} … {dates[-1]}"] if dates else []
    models = sorted({h.model for h in headline})
    if len(models) == 1:
        details.append(models[0])
    dtypes = sorted({str((r.get("point") or {}).get("dtype")) for r in probes if (r.get("point") or {}).get("dtype")})
    details += dtypes
    return where + (f" ({', '.join(details)})" if details else "")
