"""Per-op walltime of one reference Pairformer block on one GPU (inference, no autograd).

Where does a block's time go? Each op of ``PairformerBlock`` runs alone on a random pair
tensor, timed with CUDA events (median of repeats), next to its analytic FLOPs from
``cpbench.models.pairformer.flops`` when available. Used for ``docs/perf_notes.md``.

    python scripts/bench_ops.py --N 2048 4096 --out ops.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from cpbench.models.pairformer.modules.block import PairformerBlock
from cpbench.models.pairformer.parallel.layout import serial_layout


def time_ms(fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench(n_tokens: int, warmup: int, repeats: int, sizes: dict) -> dict:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    block = PairformerBlock(**sizes).to(dev, torch.bfloat16)
    layout = serial_layout()
    z = torch.randn(n_tokens, n_tokens, sizes["c_z"], device=dev, dtype=torch.bfloat16)
    s = torch.randn(n_tokens, sizes["c_s"], device=dev, dtype=torch.bfloat16)
    mask = torch.ones(n_tokens, dtype=torch.bool, device=dev)
    ops = {
        "tri_mul_out": lambda: block.tri_mul_out(z, mask, layout),
        "tri_mul_in": lambda: block.tri_mul_in(z, mask, layout),
        "tri_att_start": lambda: block.tri_att_start(z, mask, layout),
        "tri_att_end": lambda: block.tri_att_end(z, mask, layout),
        "pair_transition": lambda: block.pair_transition(z),
        "single_attention": lambda: block.attention(s, z, mask, layout),
        "single_transition": lambda: block.single_transition(s),
        "block": lambda: block(s, z, mask, layout),
    }
    out = {"N": n_tokens}
    with torch.no_grad():
        for name, fn in ops.items():
            torch.cuda.reset_peak_memory_stats()
            out[f"{name}_ms"] = round(time_ms(fn, warmup, repeats), 3)
            out[f"{name}_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            z.normal_()  # in-place ops drift z; keep it O(1)
    try:
        from cpbench.models.pairformer.flops import PairformerSizes, block_flops  # noqa: PLC0415

        flops = block_flops(n_tokens, PairformerSizes(**sizes))
        out["block_tflop"] = flops["block"] / 1e12
        out["block_tflops_per_s"] = out["block_tflop"] / (out["block_ms"] / 1e3)
    except Exception as exc:  # noqa: BLE001 - FLOPs are a nicety here
        out["flops_error"] = repr(exc)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--N", type=int, nargs="+", default=[2048])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    sizes = dict(c_s=384, c_z=128, heads_single=16, heads_tri=4, head_dim_tri=32, transition_factor=4)
    rows = [bench(n, args.warmup, args.repeats, sizes) for n in args.N]
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "sizes": sizes, "dtype": "bf16"}
    for row in rows:
        print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
