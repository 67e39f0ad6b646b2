"""Compute dtypes by name: ``bf16``, ``fp32`` and ``auto``, the default (``dtype=auto``).

``auto`` is bf16 on CUDA and on a CPU with native bf16 matrix units, else fp32: without them a
bf16 matmul is converted in software, 24x slower than fp32 on a 2-core AVX2 machine. The job
resolves it before any worker starts (``cpbench.config``) and records why; an adapter built
from a config that still says ``auto`` resolves it the same way on its device (``resolve``).
"""

from __future__ import annotations

DTYPES = ("auto", "bf16", "fp32")


def cpu_native_bf16() -> tuple[bool, str]:
    """Whether this CPU multiplies bf16 matrices in hardware, and the evidence (one phrase).

    x86: torch's CPU feature flags (``torch.cpu._is_avx512_bf16_supported``, AVX512-BF16;
    ``torch.cpu._is_amx_tile_supported``, AMX), and oneDNN willing to use them
    (``torch.ops.mkldnn._is_mkldnn_bf16_supported``, which honours ``ONEDNN_MAX_CPU_ISA``).
    Without them a bf16 matmul is converted in software: a 512³ matmul took 301 ms in bf16
    against 12.6 ms in fp32 on a 2-core AMD EPYC with AVX2 only. Other CPUs (aarch64): oneDNN's
    answer alone (it checks the Arm BF16 extension)."""
    import platform

    import torch

    mkldnn_check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    onednn = bool(mkldnn_check()) if mkldnn_check is not None else False
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return onednn, f"oneDNN bf16 support {'present' if onednn else 'absent'} on {platform.machine()}"
    flags = [name for name, check in (("avx512_bf16", "_is_avx512_bf16_supported"), ("amx", "_is_amx_tile_supported"))
             if getattr(torch.cpu, check, lambda: False)()]
    if flags and onednn:
        return True, f"CPU flags {'+'.join(flags)}"
    if flags:
        return False, f"CPU flags {'+'.join(flags)} but oneDNN may not use them (ONEDNN_MAX_CPU_ISA)"
    return False, "no avx512_bf16 or amx in the CPU flags"



def resolve(name: str, device_type: str) -> tuple[str, str]:
    """(``bf16`` | ``fp32``, why) for ``name`` on a device of ``device_type`` (``cuda`` | ``cpu``)."""
    if device_type == "cuda":
        return ("bf16", "auto: bf16 on CUDA") if name == "auto" else (name, "asked")
    native, evidence = cpu_native_bf16()
    if name == "auto":
        return ("bf16" if native else "fp32"), f"auto: {'native' if native else 'no native'} bf16 on this CPU ({evidence})"
    if name == "bf16" and not native:
        return name, f"asked; bf16 is emulated in software on this CPU, several times slower than fp32 ({evidence})"
    return name, "asked"
