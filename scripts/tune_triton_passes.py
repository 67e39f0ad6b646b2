"""Launch settings of the Triton passes (``ops/triton_passes.py``: ``TILES``; their backward,
``ops/triton_backward.py``: ``BWD_TILES``, as ``<kernel>_bwd``), measured on a GPU.

    python scripts/tune_triton_passes.py [--n 2048] [--out FILE]

Each kernel runs at the boltz2 shapes of one block at ``--n`` tokens (the whole pair tensor, as a
block away from the memory limit hands it: c_z 128, 4 x 32 attention channels, 4 triangle heads,
16 single heads, transition x4), bf16, under every setting of a small grid (rows per program,
columns or hidden channels per step, warps, stages). Each setting's median time (CUDA events,
``triton.testing.do_bench``) and effective bandwidth (the bytes the kernel must move: its inputs
once, its outputs once) are printed as one JSON line, with the best setting per kernel last.
A setting that does not compile (shared memory, registers) is reported and skipped. Copy the
best settings into ``TILES`` by hand, with the date and this script's output file. A ``_bwd``
kernel is timed as the whole backward of its autograd function (the kernel, the weight gradients'
matmuls and the LayerNorm parameters' partial sums), its bytes those the kernel must move.
``scripts/triton_resources.py --grid`` says beforehand which settings spill registers.

``--default-only`` with ``--calls=2`` runs each kernel at its setting in the code only, twice, with no
benchmark loop: the launches that ``docs/benchmarks/planned/call_v.sh`` profiles under Nsight
Compute (its printed times then are ncu's replays, not the kernel's).

On a CPU (``TRITON_INTERPRET=1``, a small ``--n`` and ``--c-z 32``) it runs each kernel once
per setting, with a wall clock: a check that the script works, not a measurement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch

from cpbench.models.pairformer.ops import triton_backward as tb
from cpbench.models.pairformer.ops import triton_passes as tp

GRID = {"BLOCK_M": (64, 128), "num_warps": (4, 8), "num_stages": (1, 3)}
STEP = {"norm_linear": ("BLOCK_N", (64, 128)), "triangle_operands": ("BLOCK_N", (64, 128)),
        "triangle_update": ("BLOCK_N", (32, 64, 128)), "swiglu_transition": ("BLOCK_H", (32, 64, 128))}
BWD_GRID = {"BLOCK_M": (32, 64), "num_warps": (4, 8), "num_stages": (1, 2)}
BWD_STEP = {"norm_linear": ("BLOCK_N", (32, 64)), "triangle_operands": ("BLOCK_N", (32, 64)),
            "swiglu_transition": ("BLOCK_H", (32, 64))}


def cases(n: int, c_z: int, device: str) -> dict:
    """Per kernel: ``(call, bytes moved)`` at one block's shapes, bf16."""
    bf = dict(device=device, dtype=torch.bfloat16)
    z = torch.randn(n, n, c_z, **bf)
    ln_w, ln_b = torch.ones(c_z, **bf), torch.zeros(c_z, **bf)
    z_b = z.numel() * 2
    qkvg = torch.randn(4 * c_z, c_z, **bf) / c_z ** 0.5
    tri_w = torch.randn(4 * c_z, c_z, **bf) / c_z ** 0.5
    mask = torch.ones(n, n, **bf)
    x = torch.randn(c_z, n, n, **bf).permute(1, 2, 0)  # the product's channel-first [c, r, N]
    w_sq = torch.randn(c_z, c_z, **bf) / c_z ** 0.5
    o, g = torch.randn(n, n, c_z, **bf), torch.randn(n, n, c_z, **bf)
    w_in, w_out = torch.randn(8 * c_z, c_z, **bf) / c_z ** 0.5, torch.randn(c_z, 4 * c_z, **bf) / (4 * c_z) ** 0.5
    return {
        "norm_linear": (lambda: tp.norm_linear(z, ln_w, ln_b, qkvg), z_b * 5),  # z in, q/k/v/g out
        "triangle_operands": (lambda: tp.triangle_operands(z, ln_w, ln_b, tri_w, mask), z_b * 3),  # z in, a and b out
        "triangle_update": (lambda: tp.triangle_update(x, z, ln_w, ln_b, ln_w, ln_b, w_sq, w_sq, True), z_b * 3),
        "gated_output": (lambda: tp.gated_output(o, g, w_sq, z), z_b * 4),  # o, g, z in, z out
        "swiglu_transition": (lambda: tp.swiglu_transition(z, ln_w, ln_b, w_in, w_out, True), z_b * 2),
    }


def backward_cases(n: int, c_z: int, device: str) -> dict:
    """Per kernel ``<name>_bwd``: ``(call, bytes moved)``, the call one backward of the autograd
    function (its forward ran once, outside the timing), bf16; the residual forms where training
    runs them (the output gradient re-read from L2 in the epilogue: no bytes counted for it)."""
    bf = dict(device=device, dtype=torch.bfloat16)

    def leaf(*shape):
        return torch.randn(*shape, **bf).requires_grad_()

    def backward(fn, *inputs):
        out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        grads = [torch.randn_like(o) for o in outs]
        needs = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        return lambda: torch.autograd.grad(outs, needs, grads, retain_graph=True)

    z, ln_w, ln_b = leaf(n, n, c_z), leaf(c_z), leaf(c_z)
    z_b = z.numel() * 2
    mask = torch.ones(n, n, **bf)
    x = leaf(c_z, n, n).permute(1, 2, 0)
    proj = leaf(n, n, 2 * c_z)
    return {  # bytes: inputs and output gradient read, input gradient and the weight-gradient operands written
        "norm_linear_bwd": (backward(tb.norm_linear, z, ln_w, ln_b, leaf(4 * c_z, c_z)), z_b * 7),
        "triangle_operands_bwd": (backward(lambda *a: tb.triangle_operands(*a, mask), z, ln_w, ln_b,
                                           leaf(4 * c_z, c_z)), z_b * 9),
        "triangle_update_bwd": (backward(tb.triangle_update, x, z, ln_w, ln_b, ln_w, ln_b, leaf(c_z, c_z),
                                         leaf(c_z, c_z), True), z_b * 9),
        "gated_output_bwd": (backward(tb.gated_output, proj[..., :c_z], proj[..., c_z:], leaf(c_z, c_z)), z_b * 7),
        "swiglu_transition_bwd": (backward(tb.swiglu_transition, z, ln_w, ln_b, leaf(8 * c_z, c_z),
                                           leaf(c_z, 4 * c_z), True), z_b * 17),
    }


def table_of(kernel: str) -> tuple[dict, str]:
    """The settings table a kernel reads and its key there."""
    return (tb.BWD_TILES, kernel[:-4]) if kernel.endswith("_bwd") else (tp.TILES, kernel)


def settings(kernel: str, default_only: bool = False) -> list[dict]:
    """The launch settings to try for ``kernel``: its grid's, or only the code's (``{}``)."""
    if default_only:
        return [{}]
    backward = kernel.endswith("_bwd")
    grid = dict(BWD_GRID if backward else GRID)
    name = kernel[:-4] if backward else kernel
    steps = BWD_STEP if backward else STEP
    if name in steps:
        key, values = steps[name]
        grid[key] = values
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def time_ms(call, cuda: bool, calls: int | None = None) -> float:
    """Median ms of ``call``: ``triton.testing.do_bench`` on a GPU; else, or with ``calls``, the
    wall clock of that many calls (two on a CPU), each synchronized."""
    if cuda and calls is None:
        import triton.testing

        return float(triton.testing.do_bench(call, warmup=10, rep=50))
    times = []
    for _ in range(calls or 2):
        start = time.perf_counter()
        call()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--c-z", type=int, default=128)
    parser.add_argument("--kernels", nargs="+", default=list(tp.TILES),
                        help="forward kernels (TILES' names) and/or <name>_bwd (their backward)")
    parser.add_argument("--default-only", action="store_true", help="only the setting in the code (TILES, BWD_TILES)")
    parser.add_argument("--calls", type=int, default=None,
                        help="this many plain calls per setting instead of do_bench's loop (under ncu: 2)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not tp.interpreted()
    rows = []
    device = "cuda" if cuda else "cpu"
    calls = cases(args.n, args.c_z, device)
    if any(k.endswith("_bwd") for k in args.kernels):
        calls |= backward_cases(args.n, args.c_z, device)
    for kernel in args.kernels:
        call, moved_b = calls[kernel]
        table, key = table_of(kernel)
        default = dict(table[key])
        results = []
        for setting in settings(kernel, args.default_only):
            table[key] = {**default, **setting}
            try:
                ms = time_ms(call, cuda, args.calls)
            except Exception as exc:  # noqa: BLE001 - a setting that does not compile is a result too
                row = {"kernel": kernel, "setting": setting or default, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            else:
                row = {"kernel": kernel, "setting": setting or default, "ms": round(ms, 4),
                       "gb_per_s": round(moved_b / ms / 1e6, 1)}
                results.append(row)
            print(json.dumps(row), flush=True)
            rows.append(row)
        table[key] = default
        if results:
            best = min(results, key=lambda r: r["ms"])
            at_default = next((r for r in results if all(default.get(k) == v for k, v in r["setting"].items())), None)
            line = {"kernel": kernel, "best": best["setting"], "best_ms": best["ms"],
                    "default_ms": at_default["ms"] if at_default else None, "N": args.n}
            print(json.dumps(line), flush=True)
            rows.append(line)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if cuda else "cpu",
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
