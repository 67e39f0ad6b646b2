"""The GPU memory sizes the report's memory model predicts a max N for.

The model itself, per-rank peak memory ``a·N² + b·N + c`` fitted over the points that fit
(``MemoryFit``, ``fit_peak_memory``, ``fitting_points``), lives in ``cpbench.results.memory_fit``,
shared with the probe's ``predict`` strategy; the report evaluates it at these sizes
(``report.memory_table``) and ``cpbench.estimate`` checks an input against them.

Example::

    from cpbench.results.memory_fit import fit_peak_memory

    fit = fit_peak_memory([512, 1024, 2048], [3.1, 9.0, 33.2], cp=1)
    [fit.max_n(gib) for gib in GPU_MEMORY_SIZES_GIB]  # largest N that fits each size at cp=1
"""

from __future__ import annotations

GPU_MEMORY_SIZES_GIB = (40, 80, 96, 141, 192)
