"""Triangle attention's flex kernel in isolation at the block's shapes, per layout of q/k/v and
per ``kernel_options`` (one H200 session's question: the in-model triangle attention ran at
160-175 TFLOP/s where the isolated kernel reached 206-222).

    python scripts/flex_tune.py --n 2048 --rows 256 --out flex_tune.json

Prints one JSON line per variant: median ms of 20 calls after 3 warmups (``bench_ops.time_ms``), TFLOP/s (4·r·h·N²·d).
"""

from __future__ import annotations

import argparse
import json

import torch
from bench_ops import time_ms
from torch.nn.attention.flex_attention import flex_attention

OPTIONS = {
    "default": None,
    "m128_n64_w8_s3": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
    "m64_n64_w4_s3": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    "m128_n128_w8_s2": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
    "m64_n128_w4_s2": {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2},
    "m128_n32_w4_s3": {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3},
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--out", default="flex_tune.json")
    args = p.parse_args()
    n, r, h, d = args.n, args.rows, 4, 32
    dev = torch.device("cuda")
    torch.manual_seed(0)
    qkvg = torch.randn(r, n, 4, h, d, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(h, n, n, device=dev, dtype=torch.bfloat16)
    strided = [t.transpose(1, 2) for t in qkvg.unbind(2)[:3]]  # [r, h, N, d] views (the model's)
    contiguous = [t.contiguous() for t in strided]
    flop = 4 * r * h * n * n * d
    results = []
    for name, opts in OPTIONS.items():
        torch._dynamo.reset()  # one function per variant: dynamo's recompile limit (8) would stop the 9th
        @torch.compile(dynamic=False)
        def run(q, k, v, b):
            def score_mod(score, bb, hh, qi, ki):
                return score + b[hh, qi, ki]
            return flex_attention(q, k, v, score_mod=score_mod, kernel_options=opts)
        for layout, qkv in (("strided", strided), ("contiguous", contiguous)):
            try:
                ms = time_ms(lambda: run(*qkv, bias), warmup=3, repeats=20)
                line = {"options": name, "layout": layout, "ms": round(ms, 3), "tflops": round(flop / ms / 1e9, 1)}
            except Exception as exc:  # noqa: BLE001 -- a config that does not compile is a result
                line = {"options": name, "layout": layout, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(json.dumps(line), flush=True)
            results.append(line)
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "n": n, "rows": r,
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
