"""Achieved TFLOP/s and MFU: a step's analytic FLOPs over its walltime, against the GPU's peak."""

from __future__ import annotations

# Per-GPU dense peaks used when ``report.peak_tflops`` is not set: (GPU name substring, dtype)
# -> (TFLOP/s, where the figure comes from). Measured, not the datasheet, so MFU is against what
# a matmul really reaches on the machine.
PEAK_TFLOPS = {
    ("H200", "bf16"): (774.0, "H200 bf16 measured 774 TFLOP/s dense 8192^3 matmul "
                              "(measured on one H200, 2026-11-30; see docs/perf_notes.md)"),
}


def peak_tflops(gpu_model: str | None, dtype: str | None, configured: float | None = None) -> tuple[float | None, str]:
    """The per-GPU peak to compute MFU against, and where it comes from.

    ``configured`` (``report.peak_tflops``) wins; else the measured table ``PEAK_TFLOPS``; else
    ``(None, reason)``, and the report shows no MFU.
    """
    if configured:
        return float(configured), f"configured report.peak_tflops = {float(configured):g} TFLOP/s"
    for (name, table_dtype), (value, source) in PEAK_TFLOPS.items():
        if gpu_model and name.lower() in gpu_model.lower() and dtype == table_dtype:
            return value, source
    return None, f"no peak known for {gpu_model or 'this device'} in {dtype or 'this dtype'}"


def achieved_tflops_per_gpu(step_flops_total: float, median_ms: float, n_gpus: int) -> float:
    """Useful TFLOP/s per GPU: the step's FLOPs over its median walltime, shared by ``n_gpus``."""
    return step_flops_total / (median_ms * 1e-3) / n_gpus / 1e12
