"""The memory model's arithmetic: the fit, its inverse (max N) and the cp scaling.

The prediction of a real held-back probe point is in tests/*/test_report.py (it needs a probe run).
"""

import pytest

from cpbench.report.memory_model import GPU_MEMORY_SIZES_GIB
from cpbench.results.memory_fit import fit_peak_memory, fitting_points


def quadratic(n, a=3e-7, b=2e-4, c=1.5):
    return a * n * n + b * n + c


def test_fit_recovers_a_quadratic_exactly():
    ns = [512, 1024, 2048, 3072, 4096]
    fit = fit_peak_memory(ns, [quadratic(n) for n in ns], cp=1)
    assert fit.form == "a·N²+b·N+c" and fit.n_points == 5
    assert (fit.a, fit.b, fit.c) == pytest.approx((3e-7, 2e-4, 1.5), rel=1e-6)
    assert fit.max_rel_residual < 1e-9


def test_max_n_is_the_largest_n_whose_predicted_peak_fits():
    fit = fit_peak_memory([1000, 2000, 4000], [quadratic(n) for n in (1000, 2000, 4000)], cp=1)
    for memory_gib in GPU_MEMORY_SIZES_GIB:
        n = fit.max_n(memory_gib, unit=128)
        assert n % 128 == 0
        assert fit.predict_gib(n) <= memory_gib < fit.predict_gib(n + 128)
    assert fit.max_n(1.0) is None  # not even one token fits under the constant term


def test_other_cp_scales_only_the_pair_term():
    fit = fit_peak_memory([1000, 2000, 4000], [quadratic(n) for n in (1000, 2000, 4000)], cp=2)
    # At cp=4 the N² term halves, the rest (replicated) stays.
    assert fit.predict_gib(4000, cp=4) == pytest.approx(quadratic(4000, a=1.5e-7))
    assert fit.max_n(80, cp=4) > fit.max_n(80, cp=2) > fit.max_n(80, cp=1)


def test_fewer_points_fit_fewer_terms():
    two = fit_peak_memory([1000, 2000], [quadratic(1000), quadratic(2000)], cp=1)
    one = fit_peak_memory([2000], [quadratic(2000)], cp=1)
    assert two.form == "a·N²+c" and two.b == 0.0
    assert two.predict_gib(2000) == pytest.approx(quadratic(2000))
    assert one.form == "a·N²" and one.predict_gib(2000) == pytest.approx(quadratic(2000))
    with pytest.raises(ValueError):
        fit_peak_memory([], [], cp=1)


def test_fitting_points_take_the_max_over_ranks_and_skip_failures():
    points = [
        {"N": 64, "fits": True, "peak_alloc_gib": [1.0, 1.5], "peak_reserved_gib": [2.0, 2.5]},
        {"N": 32, "fits": True, "peak_alloc_gib": [0.5, 0.4], "peak_reserved_gib": [1.0, 0.9]},
        {"N": 128, "fits": False, "peak_alloc_gib": None, "peak_reserved_gib": None},
    ]
    assert fitting_points(points) == ([32, 64], [1.0, 2.5])  # reserved: every fitting point has it
    points[0]["peak_reserved_gib"] = None
    assert fitting_points(points) == ([32, 64], [0.5, 1.5])  # else allocated


def test_fit_never_bends_down_where_the_peaks_flatten():
    """The H200 inference probe of the first campaign (cp=1, reserved GiB): chunk transients fill
    the free memory at small N, so the peaks flatten; an unconstrained quadratic has a < 0 there
    and predicts memory falling with N. The fit keeps every coefficient >= 0."""
    ns, peaks = [1024, 2048, 4096, 8192, 12288], [6.5, 24.6, 101.3, 120.4, 121.1]
    fit = fit_peak_memory(ns, peaks, cp=1)
    assert min(fit.a, fit.b, fit.c) >= 0.0
    assert fit.form != "a·N²+b·N+c"  # the full fit is the one with a < 0
    grid = range(1024, 65536, 1024)
    assert all(fit.predict_gib(m) <= fit.predict_gib(n) for m, n in zip(grid, grid[1:]))
    assert fit.max_n(140.0) is not None and fit.max_n(140.0) >= 12288 // 2
