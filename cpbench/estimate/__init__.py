"""Answers for one input: predicted peak memory, fitting GPUs, smallest CP and time per step.

    python -m cpbench.estimate INPUT [--from DIR] [--gpu-gib G] [--model NAME] [--workflow W] [--json]

INPUT is read with the readers of ``dataset=real`` (``cpbench.data.real``: N tokens, N_atoms,
S). Every ``result.json`` under DIR becomes the report's rows (``cpbench.report.load``: an
unreadable file is skipped with one line naming it). The default DIR is ``DEFAULT_RESULTS``, the
H200 results committed in the repository's ``docs/benchmarks/``: they live outside the package,
so an installed (non-editable) copy has none and needs ``--from``; the output says which
directory it read. Per model × workflow × CP config (× kernel backend and dtype, which change
both memory and time, × the GPU model the figures were measured on: an H100's times are not an
H200's) two models are fitted over N:

* **peak memory per rank**: the report's ``a·N² + b·N + c`` (``cpbench.results.memory_fit``,
  non-negative terms) over every (N, peak allocated) where the step fit: ok timing rows and
  probe points that fit (``report.analysis.memory_points``) -- except where a group has a
  probe's lean fitting points (``"lean": true``) at ``MIN_LEAN_POINTS`` or more distinct N:
  then only those, as the probe's own prediction does (``memory_fit.fitting_points``). A lean
  peak is the model's irreducible memory, which does not depend on how much memory is free and
  is what meets the device at the max N; the other points' chunk transients grow with the free
  memory, so a fit through both bends. It scales to other CP sizes by
  ``cp_fit / cp`` on the N² term only (the pair representation is sharded, the rest is
  replicated), as the report's memory model does -- only where the fit has an N² term.
* **time per step**: the trunk (the whole step, less the ``sampling`` stage where the adapter
  timed one) as ``a·N³ + b·N² + c``, and for workflows with sampling the sampler's own stage
  (``stats.stage_ms.sampling``) separately as ``d·N² + e·N + f``; both non-negative
  least squares over the subsets of their terms (the best fit whose terms are all >= 0; with
  fewer distinct N than terms, only the leading term and the constant, or the leading term).
  Time is the median step of the slowest rank (``median_ms``). A time fit is per CP config:
  it does not scale to other CP sizes.
* **energy per structure** (one step), where the records measured it
  (``energy_j_per_step_per_rank``, summed over ranks): the mean power measured in the group
  (energy / time of a step), interpolated linearly in N between the measured N (the nearest
  one's outside them; GPU power grows with N, so the largest N's would over-count a small
  input), times the predicted time.

The timing rows are the latest ok row of each point, a point being the group (kernels and
dtype included: the same N under two kernel backends is two points) and N. Each figure carries
the N range it was fitted on and ``extrapolated`` when INPUT's N lies outside it, and in the
table a warning where its fit misses one of its own points by more than ``POOR_FIT_RESIDUAL``
(relative); where a point at exactly INPUT's N was measured, the measured value replaces the
prediction (marked ``measured``). Bad input is one line on stderr and exit code 2
(``EstimateError``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
import pandas as pd

from cpbench.report.analysis import fitting_subset, latest_ok_timing, memory_points
from cpbench.report.load import load_records
from cpbench.report.memory_model import GPU_MEMORY_SIZES_GIB
from cpbench.report.rows import ENERGY_COLUMN, HARDWARE, STAGE_PREFIX, probe_point_rows, result_rows, short_gpu
from cpbench.results.memory_fit import MemoryFit, fit_peak_memory

# The committed results of a source checkout (editable install); absent from an installed package.
DEFAULT_RESULTS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
CP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)
GROUP_KEYS = ("model", "workflow", "CP config", "kernels", "dtype", HARDWARE)  # one GPU model's figures per fit
POOR_FIT_RESIDUAL = 0.5  # a fit that misses one of its points by more than this (relative) is flagged


class EstimateError(Exception):
    """Bad input: one line naming what is missing (the CLI prints it and exits 2)."""


# ---------------------------------------------------------------------------------------------
# Walltime fits
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PowerFit:
    """``y(N) = sum coef[p] · N**p`` over the fitted powers, coefficients >= 0."""

    coefs: dict[int, float]
    n_min: int
    n_max: int
    n_points: int
    max_rel_residual: float

    def predict(self, n: float) -> float:
        return float(sum(c * n**p for p, c in self.coefs.items()))

    def describe(self, unit: str = "ms") -> str:
        names = {3: "N³", 2: "N²", 1: "N", 0: ""}
        terms = " + ".join(f"{c:.4g}·{names[p]}" if names[p] else f"{c:.4g}" for p, c in
                           sorted(self.coefs.items(), reverse=True))
        return f"{terms} {unit}"


def fit_powers(n_tokens: Sequence[float], values: Sequence[float], powers: Sequence[int]) -> PowerFit | None:
    """Non-negative least squares of ``values`` over ``N**p`` for subsets of ``powers``.

    Of the subsets whose coefficients are all >= 0, the smallest squared error wins (ties: fewer
    terms). A subset needs at least as many distinct N as terms; with one distinct N only the
    leading power is fitted (a pure power law through the point). None when no point is given.
    """
    n = np.asarray(n_tokens, dtype=float)
    y = np.asarray(values, dtype=float)
    keep = np.isfinite(n) & np.isfinite(y)
    n, y = n[keep], y[keep]
    if n.size == 0:
        return None
    distinct = np.unique(n).size
    lead = max(powers)
    subsets = [s for k in range(len(powers), 0, -1) for s in itertools.combinations(powers, k)
               if len(s) <= distinct and (distinct > 1 or s == (lead,))]
    best: tuple[float, int, dict[int, float]] | None = None
    scale = max(float(np.max(np.abs(y))), 1e-12)
    for subset in subsets:
        design = np.stack([n**p for p in subset], axis=1)
        norm = np.max(np.abs(design), axis=0)
        coef, *_ = np.linalg.lstsq(design / norm, y / scale, rcond=None)
        coef = coef / norm * scale
        if (coef < 0).any():
            continue
        sse = float(np.sum((design @ coef - y) ** 2)) / scale**2
        key = (round(sse, 12), len(subset))
        if best is None or key < best[:2]:
            best = (*key, {int(p): float(c) for p, c in zip(subset, coef)})
    if best is None:
        return None
    fit = PowerFit(best[2], int(n.min()), int(n.max()), int(n.size), 0.0)
    pred = np.array([fit.predict(v) for v in n])
    residual = float(np.max(np.abs(pred - y) / np.maximum(np.abs(y), 1e-12)))
    return PowerFit(fit.coefs, fit.n_min, fit.n_max, fit.n_points, residual)


# ---------------------------------------------------------------------------------------------
# Reading results
# ---------------------------------------------------------------------------------------------

def load_rows(results_dir: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """(result rows, probe point rows, records) of every result.json under ``results_dir``
    (None: ``DEFAULT_RESULTS``)."""
    if results_dir is None:
        if not DEFAULT_RESULTS.is_dir():
            raise EstimateError(f"no committed results at {DEFAULT_RESULTS} (they ship with a source checkout's "
                                "docs/benchmarks/, not with the installed package): pass --from DIR")
        results_dir = DEFAULT_RESULTS
    root = Path(results_dir).resolve()
    if not root.is_dir():
        raise EstimateError(f"--from {results_dir}: no such directory")
    found = load_records(root)
    if not found:
        unread = " readable" if any(root.rglob("result.json")) else ""  # the unreadable ones: one line each above
        raise EstimateError(f"--from {results_dir}: no{unread} result.json under it")
    return result_rows(found, root), probe_point_rows(found), [rec for _, rec in found]


def results_line(results_dir: Path | None, records: list[dict]) -> str:
    """One line saying where the results were read from (the default says it is the default)."""
    where = f"{DEFAULT_RESULTS} (default: the committed benchmarks; --from DIR for others)" if results_dir is None \
        else str(Path(results_dir).resolve())
    return f"Results: {len(records)} records under {where}"


def measured_gpu_gib(records: list[dict]) -> float | None:
    """The GPU memory the results were measured on (``env.gpu_memory_gib``; the most common)."""
    sizes = [float(r["env"]["gpu_memory_gib"]) for r in records
             if (r.get("env") or {}).get("gpu_memory_gib") and (r.get("env") or {}).get("device", "cuda") == "cuda"]
    if not sizes:
        return None
    return max(set(sizes), key=sizes.count)


# ---------------------------------------------------------------------------------------------
# The estimate
# ---------------------------------------------------------------------------------------------

@dataclass
class Figure:
    """One answer: a value, its source (``measured`` | ``predicted`` | ``extrapolated``), the N range fitted."""

    value: float | None
    source: str
    n_range: tuple[int, int] | None = None
    n_points: int = 0
    model: str = ""
    # The fit's max relative residual over its own points; a class default, not a field, so the
    # JSON keeps its keys (the fitted model's text says it too). Set on predicted figures.
    max_residual: ClassVar[float | None] = None

    def text(self, fmt: str) -> str:
        if self.value is None:
            return "—"
        out = format(self.value, fmt)
        if self.source == "measured":
            return f"{out} (measured)"
        rng = f"N {self.n_range[0]:,}–{self.n_range[1]:,}" if self.n_range and self.n_range[0] != self.n_range[1] \
            else (f"N {self.n_range[0]:,}" if self.n_range else "")
        tag = "extrapolated, " if self.source == "extrapolated" else ""
        poor = (f", poor fit: max residual {100 * self.max_residual:.0f} %"
                if self.max_residual is not None and self.max_residual > POOR_FIT_RESIDUAL else "")
        return f"{out} ({tag}fit {rng}, {self.n_points} pts{poor})"


def _fitted(figure: Figure, residual: float | None) -> Figure:
    """``figure`` carrying its fit's max relative residual (for the table's poor-fit warning)."""
    figure.max_residual = residual
    return figure


@dataclass
class Answer:
    model: str
    workflow: str
    config: str
    kernels: str | None
    dtype: str | None
    cp: int
    peak_gib: Figure
    fits: dict[str, bool | None] = field(default_factory=dict)
    min_cp: int | None = None
    min_cp_note: str = ""
    time_ms: Figure | None = None
    trunk_ms: Figure | None = None
    sampling_ms: Figure | None = None
    energy_j: Figure | None = None
    memory_model: str = ""
    time_model: str = ""
    hardware: str | None = None  # the GPU model its figures were measured on (report.rows.HARDWARE)


def _source(n: int, fit_range: tuple[int, int]) -> str:
    return "predicted" if fit_range[0] <= n <= fit_range[1] else "extrapolated"


def _missing(value: Any) -> bool:
    """None or a NaN: a group key column a record left empty (pandas reads it as NaN)."""
    return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))


def _group_label(key: tuple) -> str:
    """``1d cp=2 [flex bf16]``: the CP config with the kernel backend (unless ``torch``) and dtype."""
    _, _, config, kernels, dtype, _ = key
    extra = [str(k) for k in (None if kernels == "torch" else kernels, dtype) if not _missing(k) and k != ""]
    return f"{config}" + (f" [{' '.join(extra)}]" if extra else "")


def estimate(n_tokens: int, rows: pd.DataFrame, points: pd.DataFrame, gpu_gib: float | None,
             model: str | None = None, workflow: str | None = None) -> list[Answer]:
    """One Answer per model × workflow × CP config (× kernels, dtype) with a memory or time fit.

    Raises:
        EstimateError: no group matches ``model`` / ``workflow``, or none has a fit.
    """
    mem = memory_points(rows, points, GROUP_KEYS, [*GROUP_KEYS, "N_tokens"])
    timing = latest_ok_timing(rows, [*GROUP_KEYS, "N_tokens"]) if not rows.empty else rows
    keys = sorted(_group_keys(mem) | _group_keys(timing), key=lambda k: tuple(map(str, k)))
    keys = [k for k in keys if _matches(k[0], model) and (workflow is None or k[1] == workflow)]
    if not keys:
        what = " and ".join(x for x in (f"model {model}" if model else "", f"workflow {workflow}" if workflow else "") if x)
        avail = sorted({f"{k[0]} / {k[1]}" for k in _group_keys(mem)})
        raise EstimateError(f"no results for {what or 'any model'} to fit (have: {', '.join(avail) or 'none'})")
    answers = []
    for key in keys:
        answer = _answer(n_tokens, key, _select(mem, key), _select(timing, key), gpu_gib)
        if answer is not None:
            answers.append(answer)
    if not answers:
        raise EstimateError("no fit possible: the matching results have no point that fit nor an ok timing")
    return answers


def _group_keys(frame: pd.DataFrame) -> set[tuple]:
    """The distinct ``GROUP_KEYS`` tuples of ``frame``, an empty cell as None (one key, JSON null)."""
    if frame.empty:
        return set()
    return {tuple(None if _missing(v) else v for v in k) for k in frame[list(GROUP_KEYS)].itertuples(index=False)}


def _matches(label: str | None, model: str | None) -> bool:
    return model is None or label == model or (label or "").startswith(f"{model} [")


def _select(frame: pd.DataFrame, key: tuple) -> pd.DataFrame:
    if frame.empty:
        return frame
    mask = np.ones(len(frame), dtype=bool)
    for col, value in zip(GROUP_KEYS, key):
        mask &= (frame[col].isna() if _missing(value) else frame[col] == value).to_numpy()
    return frame[mask]


def _answer(n: int, key: tuple, mem: pd.DataFrame, timing: pd.DataFrame, gpu_gib: float | None) -> Answer | None:
    cp = int((mem["cp"].iloc[0] if not mem.empty else timing["cp"].iloc[0]) or 1)
    peak = Figure(None, "none")
    memfit: MemoryFit | None = None
    if not mem.empty:
        at_n = [float(p) for v, p in zip(mem["N"], mem["peak_gib"]) if int(v) == n]  # lean or not
        mem = fitting_subset(mem)  # the probe's lean points alone where enough (module docstring)
        ns = [int(v) for v in mem["N"]]
        peaks = [float(v) for v in mem["peak_gib"]]
        memfit = fit_peak_memory(ns, peaks, cp=cp)
        rng = (min(ns), max(ns))
        peak = Figure(max(at_n), "measured") if at_n else \
            _fitted(Figure(memfit.predict_gib(n), _source(n, rng), rng, len(ns), memfit.describe()),
                    memfit.max_rel_residual)
    answer = Answer(model=key[0], workflow=key[1], config=_group_label(key), kernels=key[3], dtype=key[4], cp=cp,
                    peak_gib=peak, memory_model=memfit.describe() if memfit else "", hardware=key[5])
    if peak.value is not None:
        sizes = {"G": gpu_gib} if gpu_gib else {}
        sizes.update({f"{s}": float(s) for s in GPU_MEMORY_SIZES_GIB})
        answer.fits = {name: peak.value <= size for name, size in sizes.items()}
        answer.min_cp, answer.min_cp_note = _min_cp(n, memfit, cp, peak, gpu_gib)
    if not timing.empty:
        _time_answer(n, answer, timing)
    return answer if (peak.value is not None or answer.time_ms is not None) else None


def _min_cp(n: int, fit: MemoryFit | None, cp: int, peak: Figure, gpu_gib: float | None) -> tuple[int | None, str]:
    """The smallest CP size whose predicted peak fits ``gpu_gib``: the N² term scaled by
    ``cp_fit / cp`` (only where the fit has it; else only the fit's own cp is known)."""
    if not gpu_gib or fit is None:
        return None, "no GPU size"
    if fit.a <= 0:
        return (cp, "own cp only: no N² term") if peak.value <= gpu_gib else (None, "no N² term to scale")
    for c in CP_CANDIDATES:
        value = peak.value if c == cp else fit.predict_gib(n, c)
        if value <= gpu_gib:
            return c, "" if c == cp else f"N² scaled from cp={cp}"
    return None, f"none up to cp={CP_CANDIDATES[-1]}"


def _time_answer(n: int, answer: Answer, timing: pd.DataFrame) -> None:
    ns = [int(v) for v in timing["N_tokens"]]
    total = [float(v) for v in timing["walltime (ms)"]]
    sampling_col = STAGE_PREFIX + "sampling"
    sampled = sampling_col in timing and timing[sampling_col].notna().any()
    rng = (min(ns), max(ns))
    at_n = [i for i, v in enumerate(ns) if v == n]
    energy = timing[ENERGY_COLUMN] if ENERGY_COLUMN in timing else None
    if sampled:
        samp = [float(v) if v == v else math.nan for v in timing[sampling_col]]
        trunk = [t - s if s == s else math.nan for t, s in zip(total, samp)]
        trunk_fit = fit_powers(ns, trunk, (3, 2, 0))
        samp_fit = fit_powers(ns, samp, (2, 1, 0))
        answer.time_model = (f"trunk {trunk_fit.describe() if trunk_fit else '—'}; "
                             f"sampling stage {samp_fit.describe() if samp_fit else '—'}")
        if trunk_fit:
            answer.trunk_ms = Figure(trunk_fit.predict(n), _source(n, rng), rng, len(ns))
        if samp_fit:
            answer.sampling_ms = Figure(samp_fit.predict(n), _source(n, rng), rng, len(ns))
        predicted = (trunk_fit.predict(n) + samp_fit.predict(n)) if trunk_fit and samp_fit else None
        residual = max(trunk_fit.max_rel_residual, samp_fit.max_rel_residual) if trunk_fit and samp_fit else None
    else:
        fit = fit_powers(ns, total, (3, 2, 0))
        answer.time_model = f"step {fit.describe()}" if fit else ""
        predicted = fit.predict(n) if fit else None
        residual = fit.max_rel_residual if fit else None
    if at_n:
        answer.time_ms = Figure(float(np.median([total[i] for i in at_n])), "measured")
    elif predicted is not None:
        answer.time_ms = _fitted(Figure(predicted, _source(n, rng), rng, len(ns)), residual)
    if energy is not None and energy.notna().any():
        e_ns = [(v, float(e), t) for v, e, t in zip(ns, energy, total) if e == e and e is not None]
        at = [e for v, e, _ in e_ns if v == n]
        if at:
            answer.energy_j = Figure(at[0], "measured")
        elif answer.time_ms is not None and answer.time_ms.value:
            power = pd.Series([e / (t / 1e3) for _, e, t in e_ns], index=[v for v, _, _ in e_ns]).groupby(level=0).mean()
            power_w = float(np.interp(n, power.index.to_numpy(dtype=float), power.to_numpy()))
            e_rng = (int(power.index.min()), int(power.index.max()))
            answer.energy_j = Figure(power_w * answer.time_ms.value / 1e3, _source(n, e_rng), e_rng, len(e_ns))


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def table(answers: list[Answer], n: int, gpu_gib: float | None) -> str:
    """The answers as one markdown table."""
    g = f"{gpu_gib:g} GiB" if gpu_gib else "G"
    several = len({a.hardware for a in answers}) > 1  # then each row names the GPU it was measured on
    head = ["model", "workflow", "CP config"] + (["measured on"] if several else []) + ["peak/rank (GiB)", f"fits {g}"] + \
        [f"{s}" for s in GPU_MEMORY_SIZES_GIB] + [f"min cp ({g})", "time/step (ms)", "energy/structure (J)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in answers:
        fits = [_yes(a.fits.get("G")) if gpu_gib else "—"] + [_yes(a.fits.get(str(s))) for s in GPU_MEMORY_SIZES_GIB]
        min_cp = "—" if a.min_cp is None else str(a.min_cp)
        if a.min_cp_note and a.min_cp is not None and a.min_cp_note:
            min_cp += f" ({a.min_cp_note})"
        elif a.min_cp is None and a.peak_gib.value is not None and gpu_gib:
            min_cp = f"— ({a.min_cp_note})"
        time = a.time_ms.text(",.0f") if a.time_ms else "—"
        if a.sampling_ms is not None and a.trunk_ms is not None and a.time_ms and a.time_ms.source != "measured":
            time += f"; trunk {a.trunk_ms.value:,.0f} + sampling {a.sampling_ms.value:,.0f}"
        energy = a.energy_j.text(",.1f") if a.energy_j else "—"
        where = [short_gpu(a.hardware or "—")] if several else []
        cells = [a.model or "—", a.workflow or "—", a.config, *where, a.peak_gib.text(".2f")] + fits + [min_cp, time, energy]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def models_text(answers: list[Answer]) -> str:
    """The fitted models, one line per group."""
    out = []
    for a in answers:
        parts = [f"peak {a.memory_model}" if a.memory_model else "", f"time {a.time_model}" if a.time_model else ""]
        where = f" / {short_gpu(a.hardware)}" if a.hardware else ""
        out.append(f"- {a.model} / {a.workflow} / {a.config}{where}: " + "; ".join(p for p in parts if p))
    return "\n".join(out)


def _yes(value: bool | None) -> str:
    return "—" if value is None else ("yes" if value else "no")


def as_json(answers: list[Answer], sizes: Any, gpu_gib: float | None, results_dir: Path) -> dict:
    """The same answers as a JSON-ready dict."""
    return {"input": asdict(sizes) if sizes is not None else None, "results": str(results_dir),
            "gpu_gib": gpu_gib, "gpu_sizes_gib": list(GPU_MEMORY_SIZES_GIB),
            "answers": [asdict(a) for a in answers]}
