"""GPU energy through NVML: the board's energy counter, read around the timed repeats.

``nvmlDeviceGetTotalEnergyConsumption`` counts millijoules since the driver loaded (Volta and
later). The worker reads it before the first and after the last timed repeat of its rank's GPU
and records ``energy_j_per_step`` = (end - start) / repeats; the timing routine keeps every
rank's figure (``energy_j_per_step_per_rank``) and the report sums them. Absent (None), not
zero, wherever pynvml, NVML or the counter is missing: ``gpu_energy_j`` never raises.

Example::

    start = gpu_energy_j(device_index)          # None on a CPU or without the counter
    ...                                         # the timed repeats
    end = gpu_energy_j(device_index)
    per_step = energy_per_step(start, end, repeats)
"""

from __future__ import annotations

import os


def gpu_energy_j(device_index: int | None) -> float | None:
    """The energy counter of the GPU at CUDA index ``device_index``, in joules; None when absent.

    The CUDA index is mapped to NVML's through ``CUDA_VISIBLE_DEVICES`` where it lists indices
    (NVML numbers every GPU of the host; CUDA only the visible ones).
    """
    if device_index is None:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(device_index))
            return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1e3
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no pynvml, no NVML, no counter on this GPU: absent
        return None


def energy_per_step(start_j: float | None, end_j: float | None, repeats: int) -> float | None:
    """Joules per step over ``repeats`` steps; None when either reading is absent."""
    if start_j is None or end_j is None or repeats <= 0 or end_j < start_j:
        return None
    return (end_j - start_j) / repeats


def _nvml_index(cuda_index: int) -> int:
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and all(v.isdigit() for v in visible) and cuda_index < len(visible):
        return int(visible[cuda_index])
    return cuda_index
