"""Per-rank peak memory vs N for the report: the fit and its predicted max N at GPU sizes.

The arithmetic (``MemoryFit``, ``fit_peak_memory``, ``fitting_points``) lives in
``cpbench.results.memory_fit``, shared with the probe's ``predict`` strategy; this module
re-exports it and adds the GPU memory sizes the report predicts for.

Example::

    fit = fit_peak_memory([512, 1024, 2048], [3.1, 9.0, 33.2], cp=1)
    fit.max_n(80.0)          # largest N whose predicted peak fits in 80 GiB at cp=1
    fit.max_n(80.0, cp=2)    # ... at cp=2
"""

from __future__ import annotations

from cpbench.results.memory_fit import MemoryFit, fit_peak_memory, fitting_points

GPU_MEMORY_SIZES_GIB = (40, 80, 96, 141, 192)

__all__ = ["GPU_MEMORY_SIZES_GIB", "MemoryFit", "fit_peak_memory", "fitting_points"]
