"""Where a short trunk step's host time goes: the 64-block boltz2 trunk pass (inference, cp=1,
recycles 0, no MSA) timed as the worker times it, with the per-op host calls switched off one
at a time (one GPU).

    python scripts/step_overhead.py --n 512 --kernels flex torch --out step_overhead.json

Variants per backend: ``as_is``; ``no_free_query`` (the chunk budget's free-memory reading,
``chunking._cuda_free_bytes``: ``mem_get_info`` plus the allocator's counters per op, replaced
by the first reading); ``no_stage_peaks`` (``StageTimer``'s per-stage peak reset and read off).
Each variant: ``--warmup`` untimed steps (compiles), then the median of ``--repeats`` steps
(synchronized wall clock), and the block mean the adapter reports. Also: the host cost of each
memory query (microseconds per call), how many free-memory readings one step makes, and
dynamo's recompile counters. With ``--host-profile``, per backend, ``--repeats`` more steps under
``torch.profiler`` (CPU, and CUDA where it runs): per step the wall time, the GPU's summed kernel
time (what the host has to hide), kernel launches, compiled-region calls, and the host ops with
the most self CPU time: where a host-bound step's time goes. Prints one JSON line per (backend,
variant) and writes them all to ``--out``. Not a cpbench point: a diagnosis.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch
import torch.distributed as dist
from one_gpu import one_rank_mesh, trunk_setup

from cpbench.models.pairformer import stage_timer
from cpbench.models.pairformer.parallel import chunking


@contextlib.contextmanager
def _variant(name: str, device: torch.device):
    saved_free, saved_fold, saved_reset = chunking._cuda_free_bytes, stage_timer.StageTimer._fold_peak, None
    try:
        if name == "no_free_query":
            first = saved_free(device)
            chunking._cuda_free_bytes = lambda _device: first
        elif name == "no_stage_peaks":
            stage_timer.StageTimer._fold_peak = lambda self: None
            saved_reset = torch.cuda.reset_peak_memory_stats
            torch.cuda.reset_peak_memory_stats = lambda *a, **k: None
        yield
    finally:
        chunking._cuda_free_bytes, stage_timer.StageTimer._fold_peak = saved_free, saved_fold
        if saved_reset is not None:
            torch.cuda.reset_peak_memory_stats = saved_reset


def query_costs(device: torch.device, calls: int = 2000) -> dict:
    """Host microseconds per call of each memory query the chunk budget makes (GPU only)."""
    if device.type != "cuda":
        return {}
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 1.0)
    queries = {"mem_get_info": lambda: torch.cuda.mem_get_info(device),
               "memory_allocated": lambda: torch.cuda.memory_allocated(device),
               "memory_reserved": lambda: torch.cuda.memory_reserved(device),
               "memory_stats_as_nested_dict": lambda: torch.cuda.memory_stats_as_nested_dict(device),
               "get_per_process_memory_fraction": lambda: fraction(device),
               "_cuda_free_bytes": lambda: chunking._cuda_free_bytes(device)}
    out = {}
    for name, q in queries.items():
        q()
        t0 = time.perf_counter()
        for _ in range(calls):
            q()
        out[name] = round((time.perf_counter() - t0) / calls * 1e6, 2)
    return out


def free_query_calls(adapter, model, batch) -> int:
    """How many times one step reads the free memory (``chunking._cuda_free_bytes``)."""
    saved, count = chunking._cuda_free_bytes, [0]

    def counted(device):
        count[0] += 1
        return saved(device)
    chunking._cuda_free_bytes = counted
    try:
        adapter.run_step(model, batch, False)
    finally:
        chunking._cuda_free_bytes = saved
    return count[0]


def dynamo_counters() -> dict:
    """Dynamo's frame and recompile counters so far (a recompiling region shows here)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    return {group: dict(counters[group]) for group in ("stats", "recompiles", "graph_break") if counters.get(group)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_variant(adapter, model, batch, device, name: str, warmup: int, repeats: int) -> dict:
    with _variant(name, device):
        times_ms = []
        for i in range(warmup + repeats):
            _sync(device)
            t0 = time.perf_counter()
            adapter.run_step(model, batch, False)
            _sync(device)
            if i >= warmup:
                times_ms.append((time.perf_counter() - t0) * 1e3)
    stats = adapter.stats()
    return {"variant": name, "median_ms": round(statistics.median(times_ms), 2),
            "block_mean_ms": round(stats["stage_ms"].get("block_mean", float("nan")), 3),
            "compile_s": stats.get("compile_s")}


def host_profile(adapter, model, batch, device, repeats: int, top: int = 25) -> dict:
    """``repeats`` steps under ``torch.profiler``, per step: wall ms, the GPU's summed kernel ms,
    kernel launches, compiled-region calls, and the ``top`` host ops by self CPU ms (after the
    warmup steps of ``time_variant``: nothing compiles here)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            adapter.run_step(model, batch, False)
        _sync(device)
    wall_ms = (time.perf_counter() - t0) * 1e3 / repeats
    events = prof.key_averages()
    device_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in events
                    if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type))

    def calls(*names: str) -> float:
        return sum(e.count for e in events if any(n in e.key for n in names)) / repeats

    host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {"wall_ms": round(wall_ms, 2), "gpu_kernel_ms": round(device_us / 1e3 / repeats, 2),
            "kernel_launches": calls("cudaLaunchKernel", "cuLaunchKernel"),
            "compiled_region_calls": calls("Torch-Compiled Region"),
            "host_self_ms": {e.key[:80]: {"ms": round(e.self_cpu_time_total / 1e3 / repeats, 3),
                                          "calls": e.count / repeats} for e in host}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--kernels", nargs="+", default=["flex", "torch"])
    p.add_argument("--variants", nargs="+", default=["as_is", "no_free_query", "no_stage_peaks"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--blocks", type=int, default=64)
    p.add_argument("--host-profile", action="store_true", help="also profile --repeats steps per backend")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = torch.device(args.device)
    mesh = one_rank_mesh(device, 29511)
    costs = query_costs(device)
    print(json.dumps({"query_us": costs}), flush=True)
    rows = []
    for backend in args.kernels:
        adapter, model, batch = trunk_setup(args.n, args.blocks, backend, mesh, device)
        for name in args.variants:
            row = {"kernels": backend, "N": args.n, **time_variant(adapter, model, batch, device, name,
                                                                  args.warmup, args.repeats)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        if args.host_profile:
            row = {"kernels": backend, "N": args.n, "host_profile": host_profile(adapter, model, batch, device,
                                                                                args.repeats)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        calls = free_query_calls(adapter, model, batch)
        print(json.dumps({"kernels": backend, "free_query_calls_per_step": calls, "dynamo": dynamo_counters()},
                         default=str), flush=True)
        rows.append({"kernels": backend, "free_query_calls_per_step": calls})
        del model, batch
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "query_us": costs, "dynamo": dynamo_counters(), "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
