"""Per-rank memory caps, peak-memory measurement, and out-of-memory classification.

Runs inside a worker process only (the supervisor never touches the GPU).

* Cap (``memory.limit_gib``): on CUDA ``torch.cuda.set_per_process_memory_fraction`` so the
  caching allocator raises ``torch.OutOfMemoryError`` past the cap (emulates a smaller GPU).
  On CPU ``RLIMIT_DATA`` set to the worker's data segment after torch + gloo init plus the
  limit: an oversize tensor then fails inside torch's ``DefaultCPUAllocator`` with a
  catchable ``RuntimeError`` ("can't allocate memory"), and gloo's threads and sockets keep
  working. ``RLIMIT_DATA`` rather than ``RLIMIT_AS``: address space also counts shared
  libraries and glibc's per-thread arena reservations (PROT_NONE, never backed), so it
  overstates what a tensor may use; the data segment counts exactly the private writable
  memory tensors live in (both were tried: both give the catchable error). Under the cap the
  worker also fixes glibc's mmap threshold at 128 KiB and its arenas at one (``fix_malloc``): by default
  glibc raises it to the size of each large block freed, so later tensors of that size come
  from the heap, whose fragments stay in the data segment the cap counts, in an order that
  depends on thread timing; the failure point then moved between runs (max N 680 in one run,
  756 in the next, on the tiny trunk under a 0.4 GiB cap; with the threshold fixed four runs
  gave 792, 792, 792, 791). It costs page faults: near the limit a step took 1.6x as long.
* Peak: on CUDA ``max_memory_allocated`` / ``max_memory_reserved`` since a reset; on CPU the
  peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``) above the resident
  set at the reset, reported as both allocated and reserved (``MEASURE_CPU``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource

import torch

GIB = float(1 << 30)
MEASURE_CUDA = "cuda_allocator"          # torch.cuda.max_memory_allocated / reserved
MEASURE_CPU = "cpu_peak_rss_above_baseline"  # VmHWM - VmRSS at reset (no torch accounting on CPU)
_OOM_MARKERS = ("out of memory", "can't allocate memory", "defaultcpuallocator", "cannot allocate memory")
# Under this process's CPU cap (RLIMIT_DATA) a failed allocation outside torch's allocator shows
# only as one of these, and that is what they mean there: oneDNN's own buffers ("could not create
# a primitive", seen at the cap's edge in the tiny trunk's probe) and a C++ ``new`` inside an op,
# which torch re-raises as ``RuntimeError: std::bad_alloc`` (one rank of a cp=4 training probe
# point at the cap's edge, in a CI rehearsal of the headline test).
_CPU_CAP_FAILURES = ("could not create a primitive", "std::bad_alloc")
_cpu_capped = False  # set by apply_limit in this (worker) process
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters (malloc.h)
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's default before its dynamic raise


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure (CUDA or CPU) rather than a bug."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    markers = _OOM_MARKERS + (_CPU_CAP_FAILURES if _cpu_capped else ())
    return isinstance(exc, RuntimeError) and any(m in text for m in markers)


def _proc_status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def apply_limit(limit_gib: float | None, device: torch.device, reserve_gib: float = 0.0) -> str | None:
    """Cap this process's memory at ``limit_gib`` (see module docstring), less ``reserve_gib``
    (emulated CP: what the real run's communicator would hold, ``emulate.comm_reserve_gib``);
    returns how."""
    if limit_gib is None and not reserve_gib:
        return None
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        cap_b = min(total, (limit_gib if limit_gib is not None else total / GIB) * GIB) - reserve_gib * GIB
        fraction = max(0.0, min(1.0, cap_b / total))
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        reserve = f" ({reserve_gib:g} GiB held back for the communicator)" if reserve_gib else ""
        return f"cuda memory fraction {fraction:.4f} of {total / GIB:.1f} GiB{reserve}"
    if limit_gib is None:  # a CPU without a cap: nothing to hold back from
        return None
    global _cpu_capped
    fixed = fix_malloc()
    # Start the intra-op thread pool before the cap: a thread's stack (8 MiB, private writable)
    # counts in the data segment, and an OpenMP pool first started near the cap failed the point
    # as an error ("libgomp: Thread creation failed: Resource temporarily unavailable") instead of
    # an allocation failure; started here, its stacks are part of the baseline.
    torch.ones(1 << 20).sum()
    cap = _proc_status_bytes("VmData") + int(max(0.0, limit_gib - reserve_gib) * GIB)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    _cpu_capped = True
    return f"RLIMIT_DATA = baseline + {limit_gib - reserve_gib:g} GiB; {fixed}"


def fix_malloc() -> str:
    """Fix glibc's mmap threshold (no dynamic raise): every block above 128 KiB is its own
    mapping, returned to the system when freed, so what the cap counts at a given step does
    not depend on what an earlier step freed. And one malloc arena for every thread: an arena
    a helper thread (gloo's) opens after the cap grows the data segment by what that thread
    happened to allocate. Neither removes every source of variation: under 0.0625 GiB the tiny
    trunk's limit (cp=2, fp32, 2 cores) still lay at N=512 in two quick starts and between 576
    and 640 in a third. Returns what was done (recorded per point)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        one_arena = libc.mallopt(_M_ARENA_MAX, 1) == 1
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to fix there
        ok = one_arena = False
    if not ok:
        return "malloc threshold left as is (no glibc mallopt)"
    arenas = "; one malloc arena" if one_arena else ""
    return f"glibc mmap threshold fixed at {MMAP_THRESHOLD_BYTES // 1024} KiB{arenas}"


class PeakMemory:
    """Peak memory of this process since ``reset()``, in GiB (allocated, reserved)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.measure = MEASURE_CUDA if device.type == "cuda" else MEASURE_CPU
        self._baseline_rss = 0

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            # "5" resets the peak resident set size (VmHWM) to the current RSS (Linux >= 4.0).
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        self._baseline_rss = _proc_status_bytes("VmRSS")

    def read_gib(self) -> tuple[float, float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return (torch.cuda.max_memory_allocated(self.device) / GIB,
                    torch.cuda.max_memory_reserved(self.device) / GIB)
        peak = max(0, _proc_status_bytes("VmHWM") - self._baseline_rss) / GIB
        return peak, peak
