"""Per-rank peak memory vs N: a fitted a·N² + b·N + c (a, b, c >= 0), and the max N it predicts.

Owns the arithmetic both the probe (``cpbench.routines.probe``, strategy ``predict``) and the
report (``cpbench.report.memory_model``) use, so neither imports the other. On one rank of a
CP run the pair representation and its activations (``z: [N/cp, N, c_z]`` or
``[N/cp0, N/cp1, c_z]``) give the N² term, the single representation and per-token features
the N term, weights and the runtime the constant. So a fit at one cp predicts other cp by
scaling the N² term by ``cp_fit / cp`` (pair terms are sharded over all cp ranks; the rest is
replicated).

Example::

    fit = fit_peak_memory([512, 1024, 2048], [3.1, 9.0, 33.2], cp=1)
    fit.max_n(80.0)          # largest N whose predicted peak fits in 80 GiB at cp=1
    fit.max_n(80.0, cp=2)    # ... at cp=2
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from cpbench.results.record import max_over_ranks


@dataclass(frozen=True)
class MemoryFit:
    """``peak_gib(N) = a·N² + b·N + c`` per rank, fitted at CP size ``cp``."""

    a: float
    b: float
    c: float
    cp: int
    form: str                 # which terms were fitted (fewer points -> fewer terms)
    n_points: int
    max_rel_residual: float   # worst |fit - measured| / measured over the fitted points

    @property
    def terms(self) -> int:
        """How many coefficients the fit chose (the terms of its ``form``): with as many points
        as terms it passes through every point, so its residual says nothing."""
        return self.form.count("+") + 1

    def predict_gib(self, n_tokens: float, cp: int | None = None) -> float:
        """Predicted per-rank peak (GiB) at ``n_tokens`` and CP size ``cp`` (default: the fit's)."""
        scale = self.cp / (cp or self.cp)
        return self.a * scale * n_tokens**2 + self.b * n_tokens + self.c

    def max_n(self, memory_gib: float, cp: int | None = None, unit: int = 1) -> int | None:
        """Largest N (a multiple of ``unit``) whose predicted peak is at most ``memory_gib``.

        Returns None when not even N = ``unit`` fits, or when the fit does not grow with N.
        """
        a = self.a * self.cp / (cp or self.cp)
        b, c = self.b, self.c - memory_gib
        if a > 0:
            root = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a) if b * b - 4 * a * c >= 0 else None
        elif b > 0:
            root = -c / b
        else:
            return None
        if root is None or root < unit:
            return None
        n = int(root // unit) * unit
        # Float rounding at the root: step down until the prediction really fits.
        while n >= unit and self.predict_gib(n, cp) > memory_gib:
            n -= unit
        return n if n >= unit else None

    def record(self) -> dict:
        """The fit as ``result.json`` records it (``prediction.fit`` of a predicted probe)."""
        return {"a": self.a, "b": self.b, "c": self.c, "cp": self.cp, "form": self.form,
                "n_points": self.n_points, "max_rel_residual": self.max_rel_residual}

    def describe(self) -> str:
        return (f"{self.a:.4g}·N² + {self.b:.4g}·N + {self.c:.4g} GiB at cp={self.cp} "
                f"({self.form}, {self.n_points} points, max residual {100 * self.max_rel_residual:.1f} %)")


MIN_LEAN_POINTS = 3  # lean probe points (distinct N) that make the fit use only lean points

_TERMS = {"a": ("N²", 2), "b": ("N", 1), "c": ("", 0)}


def fit_peak_memory(n_tokens: Sequence[float], peak_gib: Sequence[float], cp: int) -> MemoryFit:
    """Least-squares fit of per-rank peak memory vs N with non-negative coefficients.

    Memory does not shrink as N grows, so no term may be negative: among the fits of the
    allowed term sets whose coefficients are all >= 0, the one with the smallest squared error
    wins (ties: the one with the N² term, then the one with fewer terms). Three or more
    distinct N may use any of a, b, c; with two or one the fit keeps the N² term (the pair term
    dominates at benchmark sizes): a·N² + c, else a·N² + b·N, else a·N². The chunk transients of
    the reference trunk grow with the free memory, so its probe peaks are not quadratic; an
    unconstrained fit then bends down (a < 0) and predicts memory falling at large N.

    Args:
        n_tokens: the N of each point that fit.
        peak_gib: per-rank peak memory at each point (the max over ranks), GiB.
        cp: the CP size the points were measured at.

    Raises:
        ValueError: no points, or the two sequences differ in length.
    """
    n = np.asarray(n_tokens, dtype=float)
    y = np.asarray(peak_gib, dtype=float)
    if n.size == 0 or n.size != y.size:
        raise ValueError(f"fit_peak_memory needs matching, non-empty points (got {n.size} N, {y.size} peaks)")
    distinct = np.unique(n).size
    if distinct >= 3:
        candidates = [t for k in (3, 2, 1) for t in itertools.combinations("abc", k)]
    else:
        candidates = [("a", "c"), ("a", "b"), ("a",)] if distinct == 2 else [("a",)]
    best: tuple[float, int, int, dict[str, float]] | None = None
    for terms in candidates:
        design = np.stack([n ** _TERMS[t][1] for t in terms], axis=1)
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        if (coef < 0).any():
            continue
        sse = float(np.sum((design @ coef - y) ** 2))
        key = (round(sse, 9), "a" not in terms, len(terms))
        if best is None or key < best[:3]:
            best = (*key, dict(zip(terms, (float(v) for v in coef))))
    coefs = best[3] if best is not None else {"a": 0.0}  # only when every peak is negative
    a, b, c = (coefs.get(t, 0.0) for t in "abc")
    form = "+".join(f"{t}·{_TERMS[t][0]}" if _TERMS[t][0] else t for t in "abc" if t in coefs)
    fitted = a * n**2 + b * n + c
    residual = float(np.max(np.abs(fitted - y) / np.maximum(np.abs(y), 1e-12)))
    return MemoryFit(a, b, c, int(cp), form, int(n.size), residual)


def fitting_points(probe_points: Iterable[dict]) -> tuple[list[int], list[float]]:
    """(N, per-rank peak GiB) of the probe points that fit, the peak being the max over ranks.

    Only the lean points (``"lean": true``, the adapter's irreducible memory) when at least
    ``MIN_LEAN_POINTS`` distinct N of them fit: their peaks do not depend on free memory, the
    others' chunk transients do. Uses reserved memory when every fitting point has it (what
    the allocator holds is what runs out), else allocated.
    """
    fits = [p for p in probe_points if p.get("fits") and p.get("N") is not None]
    lean = [p for p in fits if p.get("lean")]
    if len({p["N"] for p in lean}) >= MIN_LEAN_POINTS:
        fits = lean
    key = "peak_reserved_gib" if fits and all(max_over_ranks(p.get("peak_reserved_gib")) for p in fits) \
        else "peak_alloc_gib"
    pairs = [(int(p["N"]), max_over_ranks(p.get(key))) for p in fits]
    pairs = sorted((n, peak) for n, peak in pairs if peak is not None)
    return [n for n, _ in pairs], [peak for _, peak in pairs]
