"""Where one Pairformer block's time goes, per op, under each kernel backend (one GPU, inference).

    python scripts/block_profile.py --n 2048 --kernels flex torch --out block_profile.json

Builds one boltz2-sized block (c_s 384, c_z 128, 4 triangle heads of 32, 16 single heads) in
bf16, runs it as the trunk does (serial layout, no autograd; each op on the rows the block
gives it), and times every op (synchronized wall clock): ``--warmup`` untimed blocks (the compile of the
``flex`` regions happens there), then the median of ``--repeats`` timed blocks. Prints one JSON
line per backend, ``{"kernels", "N", "op_ms": {op: median ms}, "block_ms", "peak_gib"}``, and
writes them all to ``--out``. With ``--kernel-rows K`` one more block runs under torch.profiler
and the row also gets ``kernel_table``: per op, its GPU time and its K longest GPU kernels
(name, calls, total ms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from cpbench.models.pairformer.modules.block import PairformerBlock
from cpbench.models.pairformer.ops import kernels
from cpbench.models.pairformer.parallel.layout import serial_layout
from cpbench.models.pairformer.parallel.transpose import transpose_pair

SIZES = dict(c_s=384, c_z=128, heads_single=16, heads_tri=4, head_dim_tri=32, transition_factor=4)


def _now_ms(dev: torch.device) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() * 1e3


def _kernel_table(ops: list, s: torch.Tensor, z: torch.Tensor, rows: int) -> dict[str, dict]:
    """One more block under torch.profiler: each op's ``rows`` longest GPU kernels."""
    from torch.profiler import ProfilerActivity, profile

    table = {}
    for name, op in ops:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            s, z = op(s, z)
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        events.sort(key=lambda e: -e.device_time_total)
        total_ms = sum(e.device_time_total for e in events) / 1e3
        table[name] = {"gpu_ms": round(total_ms, 3),
                       "top": [[e.key[:90], e.count, round(e.device_time_total / 1e3, 3)] for e in events[:rows]]}
    return table


def profile_block(n_tokens: int, backend: str, warmup: int, repeats: int, device: str = "cuda",
                  kernel_rows: int = 0) -> dict:
    """Median ms per op of one block at ``n_tokens`` under ``backend`` (see the module docstring)."""
    dev = torch.device(device)
    kernels.select(backend, dev)
    torch.manual_seed(0)
    block = PairformerBlock(**SIZES).to(dev, torch.bfloat16)
    layout = serial_layout()
    z = torch.randn(n_tokens, n_tokens, 128, device=dev, dtype=torch.bfloat16)
    s = torch.randn(n_tokens, 384, device=dev, dtype=torch.bfloat16)
    mask = torch.ones(n_tokens, dtype=torch.bool, device=dev)
    ops = [
        ("tri_mul_out", lambda s, z: (s, block.tri_mul_out(z, mask, layout))),
        ("tri_mul_in", lambda s, z: (s, block.tri_mul_in(transpose_pair(z, layout), mask, layout))),
        ("tri_att_start", lambda s, z: (s, block.tri_att_start(transpose_pair(z, layout), mask, layout))),
        ("tri_att_end", lambda s, z: (s, block.tri_att_end(transpose_pair(z, layout), mask, layout))),
        ("pair_transition", lambda s, z: (s, transpose_pair(block.pair_transition(z), layout))),
        ("single_attention", lambda s, z: (block.attention(s, z, mask, layout), z)),
        ("single_transition", lambda s, z: (block.single_transition(s), z)),
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in ops}
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    with torch.no_grad():
        for rep in range(warmup + repeats):
            for name, op in ops:
                start_ms = _now_ms(dev)
                s, z = op(s, z)
                if rep >= warmup:
                    times[name].append(_now_ms(dev) - start_ms)
        table = _kernel_table(ops, s, z, kernel_rows) if kernel_rows and cuda else None
    op_ms = {name: round(statistics.median(t), 3) for name, t in times.items()}
    return {"kernel_table": table, "kernels": backend, "N": n_tokens, "op_ms": op_ms, "block_ms": round(sum(op_ms.values()), 3),
            "peak_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 3) if cuda else None,
            "compile_s": round(kernels.compile_seconds(), 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--kernels", nargs="+", default=["flex", "torch"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--kernel-rows", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for backend in args.kernels:
        row = profile_block(args.n, backend, args.warmup, args.repeats, args.device, args.kernel_rows)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
