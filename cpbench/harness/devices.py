"""What devices this process sees, without creating a CUDA context (the supervisors and the
controller must never touch a GPU)."""

from __future__ import annotations


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def local_gpu_count() -> int:
    """GPUs visible here (0 without CUDA). Never creates a CUDA context."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0

