"""The ``flex`` backend's pieces in isolation, at the trunk's shapes: triangle attention and the
fused memory-bound passes, against their eager forms (inference, no autograd).

    python scripts/flex_microbench.py [--n 2048] [--rows 256] [--cases attention options backward passes triton] [--out FILE]

Triangle attention is ``rows x 4 heads x N x 32`` (bf16 on CUDA) with one shared ``[4, N, N]``
bias, as one row chunk of the op sees it. Cases:

* ``attention``: SDPA with the bias expanded over the rows (the ``torch`` path) against
  ``flex_attention`` with the bias read in ``score_mod``, compiled with static shapes (what
  ``kernels.compiled`` does) and with dynamic shapes;
* ``options``: the static flex kernel under each of ``OPTIONS`` (Triton's ``kernel_options``:
  block sizes, warps, stages), with q/k/v as strided views of one projection (the model's
  layout) and contiguous (CUDA only);
* ``triton``: the Triton kernel written for the shape (``ops/triton_attention.py``,
  ``model.attention=triton``: each bias tile shared by ``ROWS`` rows, 1 or 2) under its default
  ``TILES`` and each setting of ``TRITON_GRID``, beside the static flex kernel, on the model's
  strided q/k/v; each line carries its largest difference from flex's output and its share of
  the H200's measured bf16 matmul ceiling (``CEILING_TFLOPS``). Needs CUDA or ``TRITON_INTERPRET=1``;
* ``backward``: the static flex kernel's forward and backward (gradients into q, k, v, as strided
  views of one projection, and into the bias, as training takes them), under each of
  ``BWD_OPTIONS`` (the backward kernel's blocks, stages and warps, ``bwd_``-prefixed
  ``kernel_options``; the forward keeps its default); TFLOP/s counts the forward's and the
  backward's matmuls (3.5× the forward's). CUDA only;
* ``passes``: the fused passes of ``ops/fused.py`` (LayerNorm + q/k/v/g projection, the SwiGLU
  transition) on ``[rows, N, 128]``, eager against compiled static and dynamic.

Each case is compiled afresh (dynamo reset: its recompile limit would otherwise stop later
variants, which then run eager). Prints one JSON line per case: median ms of ``--repeats``
calls after 3 warmups (CUDA events on CUDA, wall clock on a CPU), TFLOP/s for attention
(4·rows·heads·N²·d). ``--out`` also records the GPU and torch version. On a CPU
(``--device cpu``, small ``--n``; fp32) ``attention`` and ``passes`` run through inductor's C++
backend, which needs a C++ compiler.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from cpbench.models.pairformer.ops import fused, triton_attention, triton_passes

HEADS, HEAD_DIM, C_Z = 4, 32, 128
OPTIONS = {
    "default": None,
    "m128_n64_w8_s3": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
    "m64_n64_w4_s3": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    "m128_n128_w8_s2": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
    "m64_n128_w4_s2": {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2},
    "m128_n32_w4_s3": {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3},
}

# the backward kernel's (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, num_stages, num_warps): inductor's default
# for head dim 32 on sm_90 first (torch/_inductor/template_heuristics/triton.py, torch 2.11-2.13), then
# its sm_8x choice for head dims under 64, and neighbours (BLOCK_N1 % BLOCK_M1 == 0 and BLOCK_M2 % BLOCK_N2 == 0)
BWD_CONFIGS = ((64, 64, 64, 64, 3, 4), (32, 128, 128, 32, 3, 4), (64, 128, 128, 64, 3, 8), (64, 64, 64, 64, 2, 4),
               (64, 64, 64, 64, 3, 8), (32, 64, 64, 32, 3, 4), (32, 32, 32, 32, 3, 4), (64, 128, 128, 64, 2, 4),
               (128, 128, 128, 128, 2, 8), (32, 128, 128, 32, 2, 4), (16, 64, 64, 16, 3, 4), (64, 64, 64, 64, 1, 4))
BWD_OPTIONS = {"default": None} | {
    "blocks{}x{}x{}x{}_s{}_w{}".format(*cfg): {f"bwd_{key}": val for key, val in zip(
        ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "num_stages", "num_warps"), cfg)}
    for cfg in BWD_CONFIGS[1:]}
BWD_FLOP_FACTOR = 3.5  # forward 2 matmuls, backward 5 (recomputed scores, dP, dV, dQ, dK): 7/2

# ops/triton_attention.py's launch settings tried by the ``triton`` cases (all combinations)
# (on one H100, 2026-12-05, the two fastest of 32 settings ran 4 warps and 3 stages: 194 and 188 TFLOP/s;
# 2 and 4 stages, the next key block's dot issued ahead of the softmax, the bias staged through shared
# memory as a matmul operand and half the exponentials on the FMA pipes were slower still on one H100,
# 2026-12-06: docs/benchmarks/2026-12-06-h100-tattn2/)
TRITON_GRID = {"ROWS": (1, 2), "BLOCK_M": (64, 128), "BLOCK_N": (32, 64, 128), "num_warps": (4,), "num_stages": (3,)}
CEILING_TFLOPS = 774.0  # bf16 8192^3 matmul on one H200 (docs/perf_notes.md, "Measured ceilings")


def time_ms(fn, device: torch.device, warmup: int = 3, repeats: int = 10) -> float:
    """Median ms of ``repeats`` calls of ``fn()`` after ``warmup`` calls."""
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize(device)
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def flex_biased(q, k, v, bias, kernel_options=None):
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx, kv_idx]

    return flex_attention(q, k, v, score_mod=score_mod, kernel_options=kernel_options)


def fresh_compile(fn, dynamic: bool):
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=dynamic)


def attention_cases(n: int, rows: int, device: torch.device, dtype: torch.dtype, repeats: int):
    q, k, v = (torch.randn(rows, HEADS, n, HEAD_DIM, device=device, dtype=dtype) for _ in range(3))
    bias = torch.randn(HEADS, n, n, device=device, dtype=dtype)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(0).expand(rows, -1, -1, -1))

    yield "attention/sdpa_expanded_bias", time_ms(sdpa, device, repeats=repeats)
    for name, dynamic in (("flex_static", False), ("flex_dynamic", True)):
        run = fresh_compile(flex_biased, dynamic)
        yield f"attention/{name}", time_ms(lambda: run(q, k, v, bias), device, repeats=repeats)


def option_cases(n: int, rows: int, device: torch.device, dtype: torch.dtype, repeats: int):
    qkvg = torch.randn(rows, n, 4, HEADS, HEAD_DIM, device=device, dtype=dtype)
    bias = torch.randn(HEADS, n, n, device=device, dtype=dtype)
    strided = [t.transpose(1, 2) for t in qkvg.unbind(2)[:3]]  # [rows, h, N, d] views, as the model has them
    contiguous = [t.contiguous() for t in strided]
    for name, opts in OPTIONS.items():
        run = fresh_compile(flex_biased, dynamic=False)
        for layout, (q, k, v) in (("strided", strided), ("contiguous", contiguous)):
            case = f"options/{name}/{layout}"
            try:
                yield case, time_ms(lambda: run(q, k, v, bias, opts), device, repeats=repeats)
            except Exception as exc:  # noqa: BLE001 -- a configuration that does not compile is a result
                yield case, f"{type(exc).__name__}: {str(exc)[:300]}"


def triton_cases(n: int, rows: int, device: torch.device, dtype: torch.dtype, repeats: int, grid: bool = True):
    """(case, ms or error, largest |difference| from flex's output) per launch setting: the default
    ``TILES``, then (``grid``) each setting of ``TRITON_GRID``."""
    import itertools

    qkvg = torch.randn(rows, n, 4, HEADS, HEAD_DIM, device=device, dtype=dtype)
    q, k, v = (t.transpose(1, 2) for t in qkvg.unbind(2)[:3])  # [rows, h, N, d] views, as the model has them
    bias = torch.randn(HEADS, n, n, device=device, dtype=dtype)
    run = fresh_compile(flex_biased, dynamic=False) if device.type == "cuda" else flex_biased
    with torch.no_grad():
        want = run(q, k, v, bias).float()
    yield "triton/flex_static", time_ms(lambda: run(q, k, v, bias), device, repeats=repeats), 0.0
    settings = [None] + ([dict(zip(TRITON_GRID, values)) for values in itertools.product(*TRITON_GRID.values())]
                         if grid else [])
    for tiles in settings:
        name = "default" if tiles is None else "_".join(f"{key}{val}" for key, val in tiles.items())
        try:
            with torch.no_grad():
                got = triton_attention.attention(q, k, v, bias, tiles=tiles)
            diff = float((got.float() - want).abs().max())
            yield f"triton/{name}", time_ms(lambda: triton_attention.attention(q, k, v, bias, tiles=tiles), device,
                                            repeats=repeats), diff
        except Exception as exc:  # noqa: BLE001 -- a setting that does not compile (shared memory) is a result
            yield f"triton/{name}", f"{type(exc).__name__}: {str(exc)[:300]}", None


def backward_cases(n: int, rows: int, device: torch.device, dtype: torch.dtype, repeats: int):
    """(case, ms of one forward and backward or error) per ``BWD_OPTIONS`` entry."""
    qkvg = torch.randn(rows, n, 4, HEADS, HEAD_DIM, device=device, dtype=dtype, requires_grad=True)
    bias = torch.randn(HEADS, n, n, device=device, dtype=dtype, requires_grad=True)
    grad_out = torch.randn(rows, HEADS, n, HEAD_DIM, device=device, dtype=dtype)
    for name, opts in BWD_OPTIONS.items():
        run = fresh_compile(flex_biased, dynamic=False)

        def step():  # time_ms runs it under no_grad: the views must be taken with grad enabled
            with torch.enable_grad():
                q, k, v = (t.transpose(1, 2) for t in qkvg.unbind(2)[:3])  # [rows, h, N, d] views
                torch.autograd.grad(run(q, k, v, bias, opts), (qkvg, bias), grad_out)

        try:
            yield f"backward/{name}", time_ms(step, device, repeats=repeats)
        except Exception as exc:  # noqa: BLE001 -- a configuration that does not compile is a result
            yield f"backward/{name}", f"{type(exc).__name__}: {str(exc)[:300]}"


def pass_cases(n: int, rows: int, device: torch.device, dtype: torch.dtype, repeats: int):
    z = torch.randn(rows, n, C_Z, device=device, dtype=dtype)
    ln_w, ln_b = torch.ones(C_Z, device=device, dtype=dtype), torch.zeros(C_Z, device=device, dtype=dtype)
    w_qkvg = torch.randn(4 * HEADS * HEAD_DIM, C_Z, device=device, dtype=dtype) * C_Z ** -0.5
    w_in = torch.randn(8 * C_Z, C_Z, device=device, dtype=dtype) * 0.1
    w_out = torch.randn(C_Z, 4 * C_Z, device=device, dtype=dtype) * 0.1
    # the undecorated functions: kernels.compiled would compile them only under flex on CUDA
    for name, fn, args in (("norm_linear", fused.norm_linear.__wrapped__, (z, ln_w, ln_b, w_qkvg)),
                           ("swiglu_transition", fused._swiglu_transition.__wrapped__,
                            (z, ln_w, ln_b, w_in, w_out, False))):
        yield f"{name}/eager", time_ms(lambda: fn(*args), device, repeats=repeats)
        for mode, dynamic in (("static", False), ("dynamic", True)):
            run = fresh_compile(fn, dynamic)
            yield f"{name}/{mode}", time_ms(lambda: run(*args), device, repeats=repeats)


CASES = {"attention": attention_cases, "options": option_cases, "backward": backward_cases, "passes": pass_cases,
         "triton": triton_cases}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2048, help="tokens")
    p.add_argument("--rows", type=int, default=256, help="pair rows per call (one row chunk)")
    p.add_argument("--cases", nargs="+", choices=tuple(CASES), default=list(CASES))
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--triton-default-only", action="store_true",
                   help="the triton cases: flex and the default TILES only, not TRITON_GRID (a profiler's run)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    flop = 4 * args.rows * HEADS * args.n * args.n * HEAD_DIM
    torch.manual_seed(0)
    lines = []
    for case_set in args.cases:
        if case_set in ("options", "backward") and device.type != "cuda":
            print(json.dumps({"case": case_set, "skipped": "Triton kernel options: CUDA only"}), flush=True)
            continue
        if case_set == "triton" and device.type != "cuda" and not triton_passes.interpreted():
            print(json.dumps({"case": "triton", "skipped": "CUDA or TRITON_INTERPRET=1 only"}), flush=True)
            continue
        extra = {"grid": not args.triton_default_only} if case_set == "triton" else {}
        for case, ms, *diff in CASES[case_set](args.n, args.rows, device, dtype, args.repeats, **extra):
            line = {"case": case, "N": args.n, "rows": args.rows}
            if diff:
                line["max_abs_diff_vs_flex"] = diff[0]
            if isinstance(ms, str):
                line["error"] = ms
            else:
                line["median_ms"] = round(ms, 3)
                if case_set != "passes":
                    line["tflops"] = float(f"{flop * (BWD_FLOP_FACTOR if case_set == 'backward' else 1) / ms / 1e9:.3g}")
                    line["of_ceiling"] = round(line["tflops"] / CEILING_TFLOPS, 3)
            print(json.dumps(line), flush=True)
            lines.append(line)
    if args.out:
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        with open(args.out, "w") as f:
            json.dump({"gpu": gpu, "torch": torch.__version__, "dtype": str(dtype), "results": lines}, f, indent=1)


if __name__ == "__main__":
    main()
