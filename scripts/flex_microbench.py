"""Where the ``flex`` backend loses time: its pieces in isolation at the trunk's shapes (one H200).

    python scripts/flex_microbench.py [--n 2048] [--rows 128] [--out FILE]

Triangle attention on ``rows x 4 heads x N x 32`` with one shared ``[4, N, N]`` bias (bf16):
SDPA with the expanded bias (the ``torch`` path), ``flex_attention`` compiled with
``dynamic=False`` and with ``dynamic=True`` (what ``kernels.compiled`` uses); and the fused
passes (``ops/fused.py``) eager vs compiled (static, dynamic) on ``[rows, N, 128]``. Prints one
JSON line per case (median ms over 10 runs after 3 warmups, TFLOP/s for attention).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from cpbench.models.pairformer.ops import fused


def bench(fn, *args, warmup: int = 3, repeats: int = 10) -> float:
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def flex_biased(q, k, v, bias):
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx, kv_idx]

    return flex_attention(q, k, v, score_mod=score_mod)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    n, r, h, d, c = args.n, args.rows, 4, 32, 128
    dev, bf16 = "cuda", torch.bfloat16
    q, k, v = (torch.randn(r, h, n, d, device=dev, dtype=bf16) for _ in range(3))
    bias = torch.randn(h, n, n, device=dev, dtype=bf16)
    flops = 4 * r * h * n * n * d
    lines = []

    def report(case: str, ms: float, **extra) -> None:
        line = {"case": case, "N": n, "rows": r, "median_ms": round(ms, 3), **extra}
        print(json.dumps(line), flush=True)
        lines.append(line)

    sdpa = lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b.unsqueeze(0).expand(r, -1, -1, -1))  # noqa: E731
    for name, fn in (("sdpa_expanded_bias", sdpa), ("flex_static", torch.compile(flex_biased, dynamic=False)),
                     ("flex_dynamic", torch.compile(flex_biased, dynamic=True))):
        with torch.no_grad():
            ms = bench(fn, q, k, v, bias)
        report(f"attention/{name}", ms, tflops=round(flops / ms / 1e9, 1))
    z = torch.randn(r, n, c, device=dev, dtype=bf16)
    ln_w, ln_b = torch.ones(c, device=dev, dtype=bf16), torch.zeros(c, device=dev, dtype=bf16)
    w_qkvg = torch.randn(4 * h * d, c, device=dev, dtype=bf16) * c ** -0.5
    w_in, w_out = torch.randn(8 * c, c, device=dev, dtype=bf16) * 0.1, torch.randn(c, 4 * c, device=dev, dtype=bf16) * 0.1
    raw_norm_linear = fused.norm_linear.__wrapped__
    raw_transition = fused.swiglu_transition.__wrapped__
    for name, fn, fargs in (("norm_linear", raw_norm_linear, (z, ln_w, ln_b, w_qkvg)),
                            ("swiglu_transition", raw_transition, (z, ln_w, ln_b, w_in, w_out))):
        with torch.no_grad():
            for mode, f in (("eager", fn), ("static", torch.compile(fn, dynamic=False)),
                            ("dynamic", torch.compile(fn, dynamic=True))):
                report(f"{name}/{mode}", bench(f, *fargs))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "results": lines}, f, indent=1)


if __name__ == "__main__":
    main()
