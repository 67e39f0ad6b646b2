"""Where a training step's time goes: the boltz2 trunk (trunk only) with ``--blocks`` blocks at
``--n`` tokens, cp=1, one GPU, checkpointing on, one training step (forward, backward, AdamW)
per measurement.

    python scripts/training_profile.py --n 2048 --blocks 2 --variant eager [--lean] --out t.json

Variants (one per process: the kernel selection is process-wide):

* ``eager``: the default training path (``kernels=torch`` ops under autograd: SDPA with the
  expanded bias), each block checkpointed with its ops checkpointed inside (what a step runs);
* ``eager_block``: the same with only the block checkpointed (no per-op checkpoints inside):
  what the nested checkpoints cost in recompute, and what they save in memory;
* ``compiled``: ``kernels=flex`` with ``compile_training=True`` (flex attention's fused backward,
  compiled memory-bound passes).

``--lean``: the lean chunk budgets of a probe's fitting point (``chunking.lean_budgets``).
Per variant: the first step's wall time (compilation included) and the compile time reported,
the median of ``--repeats`` further steps, the peak allocated memory (the adapter's stage peaks
of the last of them), and one step's profiler
table of CUDA kernels plus their time grouped by kind (attention forward and backward, GEMM,
element-wise, reductions, normalisation, copies). Prints and writes one JSON object. A diagnosis,
not a cpbench point.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

import torch
from one_gpu import TRUNK_ONLY, one_rank_mesh, trunk_setup

from cpbench.models.pairformer.modules import block as block_module
from cpbench.models.pairformer.ops import kernels

# Kernel name patterns, first match wins: the kinds a step's CUDA time is grouped by.
KINDS = (
    ("attention_backward", r"(cutlassB|attention_backward|AttentionBackward|_bwd|flex_attention_backward|dq_dk|dkdv)"),
    ("attention_forward", r"(?i)(fmha|flash|attention|cudnn.*sdpa|flex|triton_tem_fused)"),
    ("gemm", r"(?i)(gemm|cutlass|sm90_xmma|nvjet|cublas|matmul|ampere_.*_s16816)"),
    ("layer_norm", r"(?i)(layer_norm|layernorm)"),
    ("reduce", r"(?i)(reduce|sum_|_sum|red_)"),
    ("copy", r"(?i)(copy|cat|transpose|memcpy|memset|fill)"),
    ("elementwise", r"(?i)(elementwise|vectorized|triton_poi|triton_per|triton_red|unrolled)"),
)


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, name)), "other")


def kernel_rows(prof) -> list[dict]:
    """CUDA kernels of the profiled step: name, calls, total ms, kind (largest first)."""
    rows = []
    for ev in prof.key_averages():
        device_us = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
        if device_us and ev.device_type == torch.autograd.DeviceType.CUDA:
            rows.append(dict(name=ev.key[:120], calls=ev.count, ms=round(device_us / 1e3, 2), kind=kind_of(ev.key)))
    return sorted(rows, key=lambda r: -r["ms"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--variant", choices=("eager", "eager_block", "compiled"), default="eager")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--lean", action="store_true", help="lean chunk budgets (what a probe's fitting point runs)")
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    mesh = one_rank_mesh(device, args.port)
    if args.variant == "eager_block":  # the block checkpointed, its ops not
        block_module.op_runner = lambda z, layout, checkpoint_ops: (lambda op, *a: op(*a))
    kernel_name = "flex" if args.variant == "compiled" else "torch"
    workflow = dict(TRUNK_ONLY, checkpointing=True, compile_training=args.variant == "compiled")
    adapter, model, batch = trunk_setup(args.n, args.blocks, kernel_name, mesh, device, workflow=workflow)
    row = dict(variant=args.variant, n=args.n, blocks=args.blocks, lean=args.lean, device=torch.cuda.get_device_name(device)
               if device.type == "cuda" else "cpu", torch=torch.__version__)

    def step() -> float:
        sync()
        t0 = time.perf_counter()
        adapter.run_step(model, batch, True, lean=args.lean)
        sync()
        return time.perf_counter() - t0

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    row["first_step_s"] = round(step(), 3)
    row["compile_s"] = round(kernels.compile_seconds(), 2)
    times = [step() for _ in range(args.repeats)]
    row["step_s"] = [round(t, 3) for t in times]
    row["median_step_s"] = round(statistics.median(times), 3)
    stats = adapter.stats()
    row["stage_ms"], row["kernels_ran"] = stats["stage_ms"], stats["kernels"]
    # the adapter's per-stage peaks (CUDA): its stage timer resets the allocator's peak per stage,
    # so max_memory_allocated after a step holds only its last stage's
    stage_peaks = stats.get("stage_peak_gib") or {}
    if stage_peaks:
        row["peak_gib"] = max(stage_peaks.values())
        row["stage_peak_gib"] = stage_peaks
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        adapter.run_step(model, batch, True, lean=args.lean)
        sync()
    rows = kernel_rows(prof)
    by_kind: dict[str, float] = {}
    for r in rows:
        by_kind[r["kind"]] = round(by_kind.get(r["kind"], 0.0) + r["ms"], 1)
    row["kernel_ms_by_kind"] = dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))
    row["kernel_ms_total"] = round(sum(r["ms"] for r in rows), 1)
    row["top_kernels"] = rows[:25]
    text = json.dumps(row)
    print(text, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
