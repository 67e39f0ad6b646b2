"""Per-rank peak memory vs N: a fitted a·N² + b·N + c, and the max N it predicts.

The probe measures per-rank peak memory at every N it tried. On one rank of a CP run the
pair representation and its activations (``z: [N/cp, N, c_z]`` or ``[N/cp0, N/cp1, c_z]``)
give the N² term, the single representation and per-token features the N term, weights and
the runtime the constant. So a fit at one cp predicts other cp by scaling the N² term by
``cp_fit / cp`` (pair terms are sharded over all cp ranks; the rest is replicated).

Example::

    fit = fit_peak_memory([512, 1024, 2048], [3.1, 9.0, 33.2], cp=1)
    fit.max_n(80.0)          # largest N whose predicted peak fits in 80 GiB at cp=1
    fit.max_n(80.0, cp=2)    # ... at cp=2
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

GPU_MEMORY_SIZES_GIB = (40, 80, 96, 141, 192)


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

    def describe(self) -> str:
        return (f"{self.a:.4g}·N² + {self.b:.4g}·N + {self.c:.4g} GiB at cp={self.cp} "
                f"({self.form}, {self.n_points} points, max residual {100 * self.max_rel_residual:.1f} %)")


def fit_peak_memory(n_tokens: Sequence[float], peak_gib: Sequence[float], cp: int) -> MemoryFit:
    """Least-squares fit of per-rank peak memory vs N.

    Three or more distinct N fit all of a, b, c; two fit a·N² + c; one fits a·N² alone (the
    pair term dominates at benchmark sizes, so fewer points keep the quadratic growth).

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
        columns, form = [n**2, n, np.ones_like(n)], "a·N²+b·N+c"
    elif distinct == 2:
        columns, form = [n**2, np.ones_like(n)], "a·N²+c"
    else:
        columns, form = [n**2], "a·N²"
    coef, *_ = np.linalg.lstsq(np.stack(columns, axis=1), y, rcond=None)
    if form == "a·N²+b·N+c":
        a, b, c = coef
    elif form == "a·N²+c":
        (a, c), b = coef, 0.0
    else:
        (a,), b, c = coef, 0.0, 0.0
    fitted = a * n**2 + b * n + c
    residual = float(np.max(np.abs(fitted - y) / np.maximum(np.abs(y), 1e-12)))
    return MemoryFit(float(a), float(b), float(c), int(cp), form, int(n.size), residual)


def fitting_points(probe_points: Iterable[dict]) -> tuple[list[int], list[float]]:
    """(N, per-rank peak GiB) of the probe points that fit, the peak being the max over ranks.

    Uses reserved memory when every fitting point has it (what the allocator holds is what
    runs out), else allocated.
    """
    fits = [p for p in probe_points if p.get("fits") and p.get("N") is not None]
    key = "peak_reserved_gib" if fits and all(max_over_ranks(p.get("peak_reserved_gib")) for p in fits) \
        else "peak_alloc_gib"
    pairs = [(int(p["N"]), max_over_ranks(p.get(key))) for p in fits]
    pairs = sorted((n, peak) for n, peak in pairs if peak is not None)
    return [n for n, _ in pairs], [peak for _, peak in pairs]


def max_over_ranks(value) -> float | None:
    """Max over ranks of a per-rank list (or a scalar); None when nothing was measured."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        values = [float(v) for v in value if v is not None]
        return max(values) if values else None
    return float(value)
