"""Where a near-limit trunk step's time goes: one boltz2 block, inference, trunk only, at one N,
without a memory cap and under caps that leave only a few GiB free beside the pair tensors
(what a probe point near the max N sees), on one GPU; or (``--workflow sampling --single``) the
default job's probe step at ``--depth`` (MSA module, trunk and sampler), one step.

    python scripts/near_limit_profile.py --n 8192 --caps-gib 0 36 34.5 --out near_limit.json
    python scripts/near_limit_profile.py --single --workflow sampling --depth 2 --n 16384 --out s.json

Per cap: one untimed step (compiles), then one step timed per op of the block (synchronized
wall clock around each of the block's modules and the trunk's other stages), the chunk sizes the
ops chose (``chunking.rows_per_chunk`` / ``divisor_chunk`` calls, by caller), and for the tightest
cap that fits a profiler table of the step's CUDA kernels. Prints one JSON line per cap. A diagnosis, not a
cpbench point.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from one_gpu import WITH_SAMPLING, one_rank_mesh, trunk_setup

from cpbench.models.pairformer.modules.block import PairformerBlock
from cpbench.models.pairformer.modules.diffusion import TokenTransformerBlock
from cpbench.models.pairformer.modules.msa_module import MsaBlock
from cpbench.models.pairformer.parallel import chunking

GIB = 1 << 30


class ChunkLog:
    """Counts the chunk sizes the ops choose: ``(caller, n, result) -> calls``."""

    def __init__(self) -> None:
        self.calls: collections.Counter = collections.Counter()
        self.saved = {}

    def _wrap(self, name: str):
        fn = getattr(chunking, name)
        self.saved[name] = fn

        @functools.wraps(fn)
        def logged(n, per_b, budget_b):
            out = fn(n, per_b, budget_b)
            f = sys._getframe(1)
            self.calls[(f"{f.f_globals.get('__name__', '?').rsplit('.', 1)[-1]}.{f.f_code.co_name}", name,
                        int(n), int(out), round(int(budget_b) / (1 << 20)))] += 1
            return out
        setattr(chunking, name, logged)

    def __enter__(self):
        self.calls.clear()
        for name in ("rows_per_chunk", "divisor_chunk"):
            self._wrap(name)
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(chunking, name, fn)

    def rows(self) -> list[dict]:
        return [{"caller": c, "fn": f, "n": n, "chunk": k, "budget_mib": b, "calls": m}
                for (c, f, n, k, b), m in sorted(self.calls.items())]


class OpClock:
    """Synchronized wall time of each op (child module) of the timed blocks, summed over the blocks
    of a class (``"PairformerBlock.tri_mul_out" -> s``), and of the diffusion module's
    ``prepare`` and per-step ``forward`` when the model samples."""

    CLASSES = (PairformerBlock, MsaBlock, TokenTransformerBlock)

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.seconds, self.saved = model, collections.defaultdict(float), []

    def _wrap(self, obj, attr: str, key: str) -> None:
        fn = getattr(obj, attr)
        self.saved.append((obj, attr, obj.__dict__.get(attr)))

        def timed(*a, _fn=fn, **k):
            _sync()
            t0 = time.perf_counter()
            out = _fn(*a, **k)
            _sync()
            self.seconds[key] += time.perf_counter() - t0
            return out
        setattr(obj, attr, timed)

    def __enter__(self):
        for block in self.model.modules():
            if isinstance(block, self.CLASSES):
                for name, child in block.named_children():
                    self._wrap(child, "forward", f"{type(block).__name__}.{name}")
        diffusion = getattr(self.model, "diffusion", None)
        if diffusion is not None:
            self._wrap(diffusion, "prepare", "DiffusionModule.prepare")
            self._wrap(diffusion, "forward", "DiffusionModule.forward")
        return self

    def __exit__(self, *exc):
        for obj, attr, before in reversed(self.saved):
            if before is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, before)
        self.saved.clear()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def set_cap(device, cap_gib: float) -> None:
    if device.type != "cuda":  # a CPU dry run of the script: no cap
        return
    total_b = torch.cuda.mem_get_info(device)[1]
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GIB / total_b) if cap_gib else 1.0, device)
    torch.cuda.empty_cache()


PROFILER_ACTIVITIES = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]


def _kernel_table(prof) -> str:
    """The profiler's kernel table (CUDA time, top 30)."""
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70)


def profile_table(adapter, model, batch) -> str:
    """The kernel table of one step."""
    with torch.profiler.profile(activities=PROFILER_ACTIVITIES) as prof:
        adapter.run_step(model, batch, False)
        _sync()
    return _kernel_table(prof)


def clocked_step(adapter, model, batch, device, row: dict, profiler=None, run_blocks=None) -> None:
    """One step with the op clock and the chunk log on (and ``profiler``, a started
    ``torch.profiler.profile``, around it when given): fills ``row`` with ``step_s``, ``op_s``,
    ``peak_gib`` (CUDA) and ``chunks``."""
    with ChunkLog() as log, OpClock(model) as clock, profiler or contextlib.nullcontext():
        t0 = time.perf_counter()
        _LIVE.update(row=row, clock=clock, log=log, t0=t0)
        adapter.run_step(model, batch, False, run_blocks=run_blocks)
        _sync()
        row["step_s"] = round(time.perf_counter() - t0, 2)
    row["op_s"] = {k: round(v, 3) for k, v in clock.seconds.items()}
    if device.type == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / GIB, 2)
    row["chunks"] = log.rows()


# What a SIGTERM (the campaign's timeout) prints before the step ends: the clock so far.
_LIVE: dict = {}


def _on_sigterm(signum, frame) -> None:
    """Prints the op clock and chunk log of the step in progress, then exits 143 at once (the
    profiler's trace is dropped: processing it could outlast the call)."""
    row = _LIVE.get("row", {})
    if "clock" in _LIVE:
        row["interrupted_after_s"] = round(time.perf_counter() - _LIVE["t0"], 1)
        row["op_s"] = {k: round(v, 3) for k, v in _LIVE["clock"].seconds.items()}
        row["chunks"] = _LIVE["log"].rows()
    _print_row(row)
    sys.stdout.flush()
    os._exit(143)


def single_step(adapter, model, batch, device, run_blocks=None) -> dict:
    """``--single``: one step (its compilation included) with the op clock, the chunk log and the
    profiler all on: the cheapest look at a point whose step takes minutes (near the real limit)."""
    row = {"cap_gib": 0.0, "single": True}
    try:
        prof = torch.profiler.profile(activities=PROFILER_ACTIVITIES)
        clocked_step(adapter, model, batch, device, row, profiler=prof, run_blocks=run_blocks)
        if device.type == "cuda":
            row["allocator"] = {k: v for k, v in torch.cuda.memory_stats(device).items()
                                if k in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")}
        row["stats"] = {k: v for k, v in adapter.stats().items() if k in ("stage_ms", "compile_s")}
        row["profile"] = _kernel_table(prof)
    except torch.OutOfMemoryError as e:
        row["oom"] = str(e).splitlines()[0][:300]
    return row


def one_cap(adapter, model, batch, device, cap_gib: float) -> dict:
    """Under ``cap_gib``: one untimed step (compiles), then the clocked step."""
    set_cap(device, cap_gib)
    row = {"cap_gib": cap_gib}
    try:
        t0 = time.perf_counter()
        adapter.run_step(model, batch, False)
        _sync()
        row["first_step_s"] = round(time.perf_counter() - t0, 2)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        clocked_step(adapter, model, batch, device, row)
        row["block_ops_s"] = round(sum(row["op_s"].values()), 2)
        row["stage_ms"] = adapter.stats().get("stage_ms")
    except torch.OutOfMemoryError as e:
        row["oom"] = str(e).splitlines()[0][:300]
    return row


def _print_row(row: dict) -> None:
    print(json.dumps({k: v for k, v in row.items() if k not in ("chunks", "profile")}), flush=True)
    for c in row.get("chunks", []):
        print("  chunk", json.dumps(c), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--caps-gib", type=float, nargs="+", default=[0.0, 36.0, 34.5], help="0: no cap")
    p.add_argument("--kernels", default="flex")
    p.add_argument("--device", default="cuda:0", help="cpu: a dry run of the script (no caps, fp32)")
    p.add_argument("--single", action="store_true", help="one step, compile included, no cap (see single_step)")
    p.add_argument("--workflow", choices=("trunk", "sampling"), default="trunk",
                   help="trunk: one trunk-only block; sampling: the default job's probe step (64 blocks "
                        "built, --depth of them run, MSA module and sampler; --single only)")
    p.add_argument("--depth", type=int, default=2, help="--workflow sampling: the probe depth (run_blocks)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = torch.device(args.device)
    mesh = one_rank_mesh(device, 29512)
    dtype = "bf16" if device.type == "cuda" else "fp32"
    if args.workflow == "sampling":
        if not args.single:
            p.error("--workflow sampling runs with --single")
        adapter, model, batch = trunk_setup(args.n, 64, args.kernels, mesh, device, dtype, WITH_SAMPLING)
    else:
        adapter, model, batch = trunk_setup(args.n, 1, args.kernels, mesh, device, dtype)
    run_blocks = args.depth if args.workflow == "sampling" else None
    signal.signal(signal.SIGTERM, _on_sigterm)
    if args.single:
        rows = [{"N": args.n, "kernels": args.kernels, "workflow": args.workflow, "run_blocks": run_blocks,
                 **single_step(adapter, model, batch, device, run_blocks)}]
        _print_row(rows[0])
        print(rows[0].get("profile", ""), flush=True)
    else:
        rows, tightest = [], None
        for cap in args.caps_gib:
            row = {"N": args.n, "kernels": args.kernels, **one_cap(adapter, model, batch, device, cap)}
            _print_row(row)
            rows.append(row)
            if "oom" not in row:
                tightest = row
        if tightest is not None:  # the kernel table of the tightest cap that fitted
            set_cap(device, tightest["cap_gib"])
            tightest["profile"] = profile_table(adapter, model, batch)
            print(f"profile at cap {tightest['cap_gib']} GiB:\n{tightest['profile']}", flush=True)
    if args.out:
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "torch": torch.__version__, "gpu": gpu}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
