"""Which SDPA backend runs triangle attention's shape fastest on this GPU (bias broadcast over rows).

    python scripts/sdpa_backends.py --N 2048
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--N", type=int, default=2048)
    p.add_argument("--rows", type=int, default=512)
    args = p.parse_args()
    n, r, h, d = args.N, args.rows, 4, 32
    dev, dt = "cuda", torch.bfloat16
    q, k, v = (torch.randn(r, h, n, d, device=dev, dtype=dt) for _ in range(3))
    bias = torch.randn(1, h, n, n, device=dev, dtype=dt)
    flop = 4 * r * h * n * n * d
    for backend in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                for _ in range(2):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=bias.expand(r, h, n, n))
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(5):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=bias.expand(r, h, n, n))
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end) / 5
                print(f"{backend.name}: N={n} rows={r} {ms:.2f} ms {flop / ms / 1e9:.0f} TFLOP/s")
        except Exception as exc:  # noqa: BLE001
            print(f"{backend.name}: unavailable ({str(exc).splitlines()[0][:120]})")


if __name__ == "__main__":
    main()
