"""Kernel-level profile of the reference block's ops on one GPU (torch.profiler tables).

    python scripts/profile_ops.py --N 2048 --ops tri_mul_out tri_att_start
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from cpbench.models.pairformer.modules.block import PairformerBlock
from cpbench.models.pairformer.parallel.layout import serial_layout


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--N", type=int, default=2048)
    p.add_argument("--ops", nargs="+", default=["tri_mul_out", "tri_att_start", "pair_transition"])
    p.add_argument("--rows", type=int, default=12)
    args = p.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    sizes = dict(c_s=384, c_z=128, heads_single=16, heads_tri=4, head_dim_tri=32, transition_factor=4)
    block = PairformerBlock(**sizes).to(dev, torch.bfloat16)
    n = args.N
    z = torch.randn(n, n, 128, device=dev, dtype=torch.bfloat16)
    s = torch.randn(n, 384, device=dev, dtype=torch.bfloat16)
    mask = torch.ones(n, dtype=torch.bool, device=dev)
    layout = serial_layout()
    calls = {
        "tri_mul_out": lambda: block.tri_mul_out(z, mask, layout),
        "tri_att_start": lambda: block.tri_att_start(z, mask, layout),
        "pair_transition": lambda: block.pair_transition(z),
        "single_attention": lambda: block.attention(s, z, mask, layout),
    }
    with torch.no_grad():
        for name in args.ops:
            fn = calls[name]
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            print(f"==== {name} N={n}")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70))


if __name__ == "__main__":
    main()
