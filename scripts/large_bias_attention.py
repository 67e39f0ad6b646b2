"""GPU check: fused attention with a bias spanning more than 2**31 bytes.

    python scripts/large_bias_attention.py [--out FILE]

The 2d triangle attention calls a fused kernel per ring step with ``q, k, v: [r, h, C, d]`` and
a bias ``[h, C, C]`` expanded over the r rows (h=4, d=32, bf16). At C=16,256 (2x2 grid, N=32,512)
the bias spans 2.11e9 bytes, at C=16,513 (N=33,026) 2.18e9: either side of 2**31. For each size
this runs the memory-efficient and cuDNN kernels (``torch.ops.aten``), ``F.scaled_dot_product_attention``
and ``sdpa_with_lse`` (which attends in pieces above ``MAX_BIAS_SPAN_BYTES``) on the same fresh
random inputs, against a reference computed one head and 2,048 query rows at a time with the
memory-efficient kernel. Prints one JSON line per kernel and size (finite, max error of the output
relative to its largest magnitude); exits 1 when ``sdpa_with_lse`` is not finite or disagrees.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from cpbench.models.pairformer.ops import sdpa_lse

HEADS, HEAD_DIM, ROWS = 4, 32, 2
TOL = 2e-2  # bf16 output, relative to its largest magnitude


def _efficient(q, k, v, bias):
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True)[0]


def _cudnn(q, k, v, bias):
    return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True)[0]


def _reference(q, k, v, bias):
    o = torch.empty_like(q)
    for h in range(q.shape[1]):
        for q0 in range(0, q.shape[2], 2048):
            qs = slice(q0, q0 + 2048)
            o[:, h:h + 1, qs] = _efficient(q[:, h:h + 1, qs].contiguous(), k[:, h:h + 1].contiguous(),
                                           v[:, h:h + 1].contiguous(), bias[:, h:h + 1, qs])
    return o


def check(n: int) -> list[dict]:
    torch.manual_seed(n)
    dev, dt = torch.device("cuda"), torch.bfloat16
    q, k, v = (torch.randn(ROWS, HEADS, n, HEAD_DIM, device=dev, dtype=dt) for _ in range(3))
    bias = sdpa_lse._aligned(torch.randn(HEADS, n, n, device=dev, dtype=dt).unsqueeze(0).expand(ROWS, -1, -1, -1))
    ref = _reference(q, k, v, bias).float()
    scale = float(ref.abs().max())
    runs = {"efficient": _efficient, "cudnn": _cudnn, "F.sdpa": lambda *a: F.scaled_dot_product_attention(
        a[0], a[1], a[2], attn_mask=a[3]), "sdpa_with_lse": lambda *a: sdpa_lse.sdpa_with_lse(*a)[0]}
    lines = []
    for name, run in runs.items():
        line = {"kernel": name, "C": n, "bias_span_bytes": sdpa_lse._span_bytes(bias[:1]),
                "pieces": len(sdpa_lse.bias_pieces(bias)) if name == "sdpa_with_lse" else 1}
        try:
            o = run(q, k, v, bias).float()
            torch.cuda.synchronize()
            line |= {"finite": bool(torch.isfinite(o).all()), "max_rel_err": float((o - ref).abs().max()) / scale}
        except RuntimeError as exc:
            line |= {"error": str(exc).splitlines()[0][:200]}
        if name == "sdpa_with_lse":
            line["kernel_in_use"] = sdpa_lse.kernel_in_use()
        print(json.dumps(line), flush=True)
        lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16256, 16513])
    args = parser.parse_args()
    print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                      "cudnn": torch.backends.cudnn.version()}))
    lines = [line for n in args.sizes for line in check(n)]
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    ours = [line for line in lines if line["kernel"] == "sdpa_with_lse"]
    raise SystemExit(0 if all(line.get("finite") and line["max_rel_err"] <= TOL for line in ours) else 1)


if __name__ == "__main__":
    main()
