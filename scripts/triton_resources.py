"""What each Triton kernel of the trunk costs the GPU in registers, spills and shared memory,
compiled for an H100/H200 (sm_90) on a machine without one.

    python scripts/triton_resources.py [--n 2048] [--kernels attention norm_linear ...] [--grid] [--out FILE]

Each kernel is launched by its own wrapper (``ops/triton_passes.py``, ``ops/triton_backward.py``,
``ops/triton_attention.py``) on CPU tensors of one block's shapes at ``--n`` tokens (boltz2: c_z
128, 4 triangle heads of 32, transition ×4; a chunk of 16 pair rows, ``--dtype`` bf16 or fp32), with the launch
intercepted: the arguments are specialised as Triton's JIT specialises them at run time (integers
equal to 1 become constants, multiples of 16 and aligned pointers get divisibility attributes),
and the kernel is compiled by Triton's NVIDIA backend for sm_90 without a GPU. ``cuobjdump``
(shipped with Triton) reads the registers per thread and the stack (spilled registers) from the
binary. One JSON line per kernel and launch setting: ``regs``, ``spill_bytes`` (per thread),
``shared_kib`` and ``fits_shared`` (at most 227 KiB: a block that asks more does not launch),
the matmul instructions (``wgmma``: Hopper's warp-group MMA; ``mma.sync``: the warp-level one)
and the compile seconds. ``--grid`` adds the settings that ``scripts/tune_triton_passes.py`` and
``scripts/flex_microbench.py --cases triton`` time on a GPU, so that a setting that spills is
known before device time is spent on it.

A kernel that spills keeps part of its working set in local memory (the L1/L2 caches and DRAM),
so a memory-bound pass that spills moves more bytes than the op needs. The figures are those of
the Triton installed here; the GPU image's version (3.6.0 on 2026-12-05) allocates differently, so
compare with it: ``pip install --no-deps --target DIR triton==3.6.0``, then ``PYTHONPATH=DIR``.
Needs Triton's NVIDIA backend (``pip install triton`` on Linux x86-64); not ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import tempfile
import time
from typing import Callable

import torch

os.environ.pop("TRITON_INTERPRET", None)  # the kernels must be JIT functions, not interpreted ones

import triton  # noqa: E402
from flex_microbench import TRITON_GRID  # noqa: E402 -- scripts/, first on the path of a script
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402
from tune_triton_passes import table_of  # noqa: E402

from cpbench.models.pairformer.ops import triton_attention as ta  # noqa: E402
from cpbench.models.pairformer.ops import triton_backward as tb  # noqa: E402
from cpbench.models.pairformer.ops import triton_passes as tp  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
SHARED_LIMIT_KIB = 227  # the most shared memory one block may use on an H100/H200 (232,448 bytes)
ROWS = 16  # pair rows per call: the compile depends on strides and sizes' divisibility, not on the count
C_Z, HEADS, HEAD_DIM = 128, 4, 32
PASSES = ("norm_linear", "triangle_operands", "triangle_update", "gated_output", "swiglu_transition")
GRID = {"BLOCK_M": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 3)}
STEPS = (32, 64, 128)  # BLOCK_N / BLOCK_H of the kernels that loop over output columns or hidden channels


def captured_launches(call: Callable[[], object]) -> list[tuple[JITFunction, tuple, dict]]:
    """``(kernel, args, kwargs)`` of every Triton launch ``call`` makes (none runs)."""
    launches = []
    original = JITFunction.__getitem__
    JITFunction.__getitem__ = lambda self, grid: (lambda *args, **kwargs: launches.append((self, args, kwargs)))
    try:
        call()
    finally:
        JITFunction.__getitem__ = original
    return launches


def compile_sm90(kernel: JITFunction, args: tuple, kwargs: dict):
    """``kernel`` compiled for sm_90 with the run-time specialisation of ``args``/``kwargs``."""
    backend = make_backend(SM90)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=SM90, options=options.__dict__)


def resources(compiled) -> dict:
    """Registers and stack per thread (``cuobjdump``), shared memory, matmul instructions."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    regs, stack = re.search(r"REG:(\d+)", usage), re.search(r"STACK:(\d+)", usage)
    ptx = compiled.asm["ptx"]
    shared_kib = compiled.metadata.shared / 1024
    return {"regs": int(regs.group(1)) if regs else None, "spill_bytes": int(stack.group(1)) if stack else None,
            "shared_kib": shared_kib, "fits_shared": shared_kib <= SHARED_LIMIT_KIB,
            "mma": "wgmma" if "wgmma" in ptx else "mma.sync" if "mma.sync" in ptx else "none"}


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def calls(n: int, dtype: str = "bf16") -> dict[str, Callable[[], object]]:
    """One call per kernel family at one block's shapes (forward passes, their backward through
    autograd, the attention) in ``dtype`` (fp32: the parity runs' launch settings); weights and
    inputs uninitialised (nothing runs)."""
    bf = dict(dtype=DTYPES[dtype])
    z = torch.empty(ROWS, n, C_Z, **bf)
    zt = torch.empty(n, ROWS, C_Z, **bf).transpose(0, 1)  # the serial layout's Z^T rows
    ln_w, ln_b = torch.empty(C_Z, **bf), torch.empty(C_Z, **bf)
    w4, w_sq = torch.empty(4 * C_Z, C_Z, **bf), torch.empty(C_Z, C_Z, **bf)
    w_in, w_out = torch.empty(8 * C_Z, C_Z, **bf), torch.empty(C_Z, 4 * C_Z, **bf)
    mask = torch.empty(ROWS, n, **bf)
    x = torch.empty(C_Z, ROWS, n, **bf).permute(1, 2, 0)  # the product's channel-first [c, r, N]
    proj = torch.empty(ROWS, n, 2 * C_Z, **bf)
    o, g = proj[..., :C_Z], proj[..., C_Z:]
    qkvg = torch.empty(ROWS, n, 4, HEADS, HEAD_DIM, **bf)
    q, k, v = (t.transpose(1, 2) for t in qkvg.unbind(2)[:3])
    bias = torch.empty(HEADS, n, n, **bf)

    def grad(fn, *inputs):
        leaves = [t.detach().requires_grad_() if isinstance(t, torch.Tensor) else t for t in inputs]
        out = fn(*leaves)
        torch.autograd.backward(out, [torch.empty_like(t) for t in (out if isinstance(out, tuple) else (out,))])

    return {
        "attention": lambda: ta.attention(q, k, v, bias),
        "norm_linear": lambda: tp.norm_linear(zt, ln_w, ln_b, w4),
        "triangle_operands": lambda: tp.triangle_operands(zt, ln_w, ln_b, w4, mask),
        "triangle_update": lambda: tp.triangle_update(x, z, ln_w, ln_b, ln_w, ln_b, w_sq, w_sq, True),
        "gated_output": lambda: tp.gated_output(o, g, w_sq, z),
        "swiglu_transition": lambda: tp.swiglu_transition(z, ln_w, ln_b, w_in, w_out, True),
        "norm_linear_bwd": lambda: grad(tb.norm_linear, zt, ln_w, ln_b, w4),
        "triangle_operands_bwd": lambda: grad(lambda *a: tb.triangle_operands(*a, mask), zt, ln_w, ln_b, w4),
        "triangle_update_bwd": lambda: grad(tb.triangle_update, x, z, ln_w, ln_b, ln_w, ln_b, w_sq, w_sq, True),
        "gated_output_bwd": lambda: grad(tb.gated_output, o, g, w_sq),
        "swiglu_transition_bwd": lambda: grad(tb.swiglu_transition, z, ln_w, ln_b, w_in, w_out, True),
    }


def tables(name: str) -> tuple[dict, str]:
    """The launch-settings table a kernel family reads and its key there (the passes' as
    ``scripts/tune_triton_passes.py`` tunes them)."""
    if name == "attention":
        return {"attention": ta.TILES}, "attention"
    return table_of(name)


def settings(name: str, grid: bool) -> list[dict | None]:
    """``None`` (the table's own setting), then with ``grid`` each alternative."""
    if not grid:
        return [None]
    space = TRITON_GRID if name == "attention" else dict(GRID)
    table, key = tables(name)
    for step in ("BLOCK_N", "BLOCK_H"):
        if name != "attention" and step in table[key]:
            space[step] = STEPS
    return [None] + [dict(zip(space, values)) for values in itertools.product(*space.values())]


def run(name: str, call: Callable[[], object], setting: dict | None) -> list[dict]:
    table, key = tables(name)
    saved = dict(table[key])
    if setting:
        table[key].update(setting)
    try:
        launches = captured_launches(call)
        lines = []
        for kernel, args, kwargs in launches:
            if name.endswith("_bwd") and kernel.fn.__module__ != tb.__name__:
                continue  # the forward launch of an autograd function
            start = time.perf_counter()
            try:
                info = resources(compile_sm90(kernel, args, kwargs))
            except Exception as exc:  # noqa: BLE001 -- a setting that does not compile is a result
                info = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            lines.append({"kernel": name, "triton_fn": kernel.fn.__name__, "setting": setting or "default",
                          "launch": {k: v for k, v in kwargs.items() if k.isupper() or k.startswith("num_")},
                          **info, "compile_s": round(time.perf_counter() - start, 1)})
        return lines
    finally:
        table[key].clear()
        table[key].update(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2048, help="tokens")
    parser.add_argument("--kernels", nargs="+", default=None, help="default: every kernel family")
    parser.add_argument("--grid", action="store_true", help="also every alternative launch setting")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    families = calls(args.n, args.dtype)
    lines = []
    for name in args.kernels or list(families):
        for setting in settings(name, args.grid):
            for line in run(name, families[name], setting):
                print(json.dumps(line), flush=True)
                lines.append(line)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"target": "sm_90", "triton": triton.__version__, "torch": torch.__version__, "N": args.n,
                       "dtype": args.dtype,
                       "rows": ROWS, "lines": lines}, f, indent=1)


if __name__ == "__main__":
    main()
