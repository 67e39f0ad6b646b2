"""Triton kernels that read the pair tensor once per op: LayerNorm inside the projection, gates
and the residual add in its epilogue (the ``triton`` choice of ``model.passes``).

Under ``ops/fused.py``'s compiled regions, inductor writes LayerNorm's output, cuBLAS reads it
back and writes the projections, and another pass applies the gates: about a dozen passes over
a ``z``-sized tensor per op. Here each kernel loads a tile of ``BLOCK_M`` pair rows with all
their ``C`` channels (``C`` = 128 for ``z``: the whole LayerNorm fits a tile), normalises it in
registers, multiplies it by the weights (``tl.dot``, fp32 accumulation) and writes only the op's
result:

* ``norm_linear``: ``LN(x) @ wᵀ`` (the triangle attention's q/k/v/g and bias projections, the
  single attention's pair bias);
* ``triangle_operands``: triangle multiplication's gated, masked ``a`` and ``b``, stored
  channel-first (``[k, r, N]``) where the product wants them;
* ``triangle_update``: ``W_out LN(x) * sigmoid(W_g LN(z))`` (+ ``z`` in place), both LayerNorms
  in one kernel, ``x`` read channel-strided as the product leaves it;
* ``gated_output``: ``W_out (o * sigmoid(g))`` (+ ``acc`` in place);
* ``swiglu_transition``: the whole transition, ``W_out (silu(a) * b)`` with ``[a; b] = W_in LN(x)``,
  hidden channels in chunks that never leave the chip (+ ``x`` in place).

A program owns ``BLOCK_M`` rows: it loads and normalises them once and loops over the output
columns (or, in the transition, the hidden channels) in blocks, so z is read once whatever the
width of the projection. Every tensor is addressed through its strides as ``[R, N, C]`` (any view: the transposed pair of
the serial layout, row slices, channel-first operands), with 64-bit offsets (pair shards pass
2**31 elements). Rows are independent, so a kernel may write in place over the rows it read.
These are the forward kernels; ``ops/triton_backward.py`` gives them a Triton backward for training.

``TRITON_INTERPRET=1`` runs these kernels on a CPU (Triton's interpreter, with CPU tensors): the
parity tests do that (``tests/unit/test_triton_passes.py``), against the ``torch`` functions.
"""

from __future__ import annotations

import importlib.util
import os

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
EPS = 1e-5

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rows(pid, BLOCK_M: tl.constexpr, M, ncols):
        """This program's ``BLOCK_M`` rows as (i, j) of ``[R, N]`` (int64) and their mask."""
        m = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        return m // ncols, m % ncols, m < M

    @triton.jit
    def _normed(x_ptr, i, j, ok, s0, s1, sc, lnw_ptr, lnb_ptr, eps, C: tl.constexpr, HAS_LNB: tl.constexpr):
        """The tile ``x[i, j, :]`` ``[BLOCK_M, C]`` in fp32 and its LayerNorm: ``(x, x̂, rstd, LN(x))``
        (the backward kernels of ``ops/triton_backward.py`` use ``x̂`` and ``rstd``)."""
        c = tl.arange(0, C)
        x = tl.load(x_ptr + i[:, None] * s0 + j[:, None] * s1 + c[None, :] * sc, mask=ok[:, None], other=0.0)
        x = x.to(tl.float32)
        xc = x - (tl.sum(x, axis=1) / C)[:, None]
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / C + eps)
        xhat = xc * rstd[:, None]
        y = xhat * tl.load(lnw_ptr + c).to(tl.float32)[None, :]
        if HAS_LNB:
            y += tl.load(lnb_ptr + c).to(tl.float32)[None, :]
        return x, xhat, rstd, y

    @triton.jit
    def _weight_t(w_ptr, n0, n_out, swn, swk, K: tl.constexpr, BLOCK_N: tl.constexpr):
        """``w[n0:n0+BLOCK_N, :K]ᵀ`` as ``[K, BLOCK_N]`` (rows past ``n_out`` read as 0)."""
        n = n0 + tl.arange(0, BLOCK_N)
        k = tl.arange(0, K)
        return tl.load(w_ptr + n[None, :] * swn + k[:, None] * swk, mask=(n < n_out)[None, :], other=0.0)

    @triton.jit
    def _norm_linear_kernel(x_ptr, s0, s1, sc, lnw_ptr, lnb_ptr, w_ptr, swn, swk, o_ptr, o0, o1, oc,
                            M, ncols, n_out, eps, C: tl.constexpr, HAS_LNB: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
        """One tile of rows, normalised once, against every ``BLOCK_N`` columns of ``w`` in turn."""
        i, j, ok = _rows(tl.program_id(0), BLOCK_M, M, ncols)
        _, _, _, xn = _normed(x_ptr, i, j, ok, s0, s1, sc, lnw_ptr, lnb_ptr, eps, C, HAS_LNB)
        xn = xn.to(w_ptr.dtype.element_ty)
        for n0 in range(0, n_out, BLOCK_N):
            acc = tl.dot(xn, _weight_t(w_ptr, n0, n_out, swn, swk, C, BLOCK_N), input_precision=PREC)
            n = n0 + tl.arange(0, BLOCK_N)
            tl.store(o_ptr + i[:, None] * o0 + j[:, None] * o1 + n[None, :] * oc, acc.to(o_ptr.dtype.element_ty),
                     mask=ok[:, None] & (n < n_out)[None, :])

    @triton.jit
    def _triangle_operands_kernel(z_ptr, s0, s1, sc, lnw_ptr, lnb_ptr, w_ptr, swn, swk, mask_ptr, m0, m1,
                                  a_ptr, a0, a1, a2, b_ptr, b0, b1, b2, M, ncols, k_ch, eps,
                                  C: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
        """``w: [4k, C]`` = projections of a, of b, gates of a, of b; ``BLOCK_N`` channels of each in turn."""
        i, j, ok = _rows(tl.program_id(0), BLOCK_M, M, ncols)
        _, _, _, zn = _normed(z_ptr, i, j, ok, s0, s1, sc, lnw_ptr, lnb_ptr, eps, C, True)
        zn = zn.to(w_ptr.dtype.element_ty)
        mask = tl.load(mask_ptr + i * m0 + j * m1, mask=ok, other=0.0).to(tl.float32)[:, None]
        for n0 in range(0, k_ch, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            pa = tl.dot(zn, _weight_t(w_ptr, n0, 4 * k_ch, swn, swk, C, BLOCK_N), input_precision=PREC)
            ga = tl.dot(zn, _weight_t(w_ptr, 2 * k_ch + n0, 4 * k_ch, swn, swk, C, BLOCK_N), input_precision=PREC)
            a = pa * tl.sigmoid(ga) * mask
            tl.store(a_ptr + n[None, :] * a0 + i[:, None] * a1 + j[:, None] * a2, a.to(a_ptr.dtype.element_ty),
                     mask=ok[:, None])
            pb = tl.dot(zn, _weight_t(w_ptr, k_ch + n0, 4 * k_ch, swn, swk, C, BLOCK_N), input_precision=PREC)
            gb = tl.dot(zn, _weight_t(w_ptr, 3 * k_ch + n0, 4 * k_ch, swn, swk, C, BLOCK_N), input_precision=PREC)
            b = pb * tl.sigmoid(gb) * mask
            tl.store(b_ptr + n[None, :] * b0 + i[:, None] * b1 + j[:, None] * b2, b.to(b_ptr.dtype.element_ty),
                     mask=ok[:, None])

    @triton.jit
    def _triangle_update_kernel(x_ptr, x0, x1, xc, z_ptr, z0, z1, zc, lnxw_ptr, lnxb_ptr, lnzw_ptr, lnzb_ptr,
                                wo_ptr, swo_n, swo_k, wg_ptr, swg_n, swg_k, o_ptr, o0, o1, oc, M, ncols, eps,
                                CX: tl.constexpr, C: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                                PREC: tl.constexpr, BLOCK_N: tl.constexpr):
        """``BLOCK_N`` output channels per step (``C`` at most: one step): two ``[BLOCK_M, BLOCK_N]``
        accumulators live, the weights staged per step, and each step's residual columns loaded
        again (this program's own rows) rather than an fp32 ``z`` tile kept in registers."""
        i, j, ok = _rows(tl.program_id(0), BLOCK_M, M, ncols)
        _, _, _, xn = _normed(x_ptr, i, j, ok, x0, x1, xc, lnxw_ptr, lnxb_ptr, eps, CX, True)
        _, _, _, zn = _normed(z_ptr, i, j, ok, z0, z1, zc, lnzw_ptr, lnzb_ptr, eps, C, True)
        xn = xn.to(wo_ptr.dtype.element_ty)
        zn = zn.to(wg_ptr.dtype.element_ty)
        for n0 in range(0, C, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            upd = tl.dot(xn, _weight_t(wo_ptr, n0, C, swo_n, swo_k, CX, BLOCK_N), input_precision=PREC)
            upd *= tl.sigmoid(tl.dot(zn, _weight_t(wg_ptr, n0, C, swg_n, swg_k, C, BLOCK_N), input_precision=PREC))
            if RESIDUAL:
                upd += tl.load(z_ptr + i[:, None] * z0 + j[:, None] * z1 + n[None, :] * zc, mask=ok[:, None],
                               other=0.0).to(tl.float32)
            tl.store(o_ptr + i[:, None] * o0 + j[:, None] * o1 + n[None, :] * oc,
                     upd.to(o_ptr.dtype.element_ty), mask=ok[:, None])

    @triton.jit
    def _gated_output_kernel(o_ptr, q0, q1, qc, g_ptr, g0, g1, gc, w_ptr, swn, swk, acc_ptr, a0, a1, ac,
                             out_ptr, u0, u1, uc, M, ncols, K: tl.constexpr, C: tl.constexpr,
                             RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, PREC: tl.constexpr):
        i, j, ok = _rows(tl.program_id(0), BLOCK_M, M, ncols)
        k = tl.arange(0, K)
        o = tl.load(o_ptr + i[:, None] * q0 + j[:, None] * q1 + k[None, :] * qc, mask=ok[:, None], other=0.0)
        g = tl.load(g_ptr + i[:, None] * g0 + j[:, None] * g1 + k[None, :] * gc, mask=ok[:, None], other=0.0)
        h = o.to(tl.float32) * tl.sigmoid(g.to(tl.float32))
        w = _weight_t(w_ptr, 0, C, swn, swk, K, C)
        upd = tl.dot(h.to(w.dtype), w, input_precision=PREC)
        c = tl.arange(0, C)
        if RESIDUAL:
            upd += tl.load(acc_ptr + i[:, None] * a0 + j[:, None] * a1 + c[None, :] * ac, mask=ok[:, None],
                           other=0.0).to(tl.float32)
        tl.store(out_ptr + i[:, None] * u0 + j[:, None] * u1 + c[None, :] * uc, upd.to(out_ptr.dtype.element_ty),
                 mask=ok[:, None])

    @triton.jit
    def _swiglu_kernel(x_ptr, s0, s1, sc, lnw_ptr, lnb_ptr, wi_ptr, swi_n, swi_k, wo_ptr, swo_n, swo_k,
                       o_ptr, o0, o1, oc, M, ncols, hidden, eps, C: tl.constexpr, RESIDUAL: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, PREC: tl.constexpr):
        """``hidden`` channels in chunks of ``BLOCK_H``: ``a`` is ``W_in`` rows ``[h, h+BLOCK_H)``,
        ``b`` rows ``hidden + [h, h+BLOCK_H)``; the chunk's ``silu(a) * b`` meets ``W_out[:, h:...]``."""
        i, j, ok = _rows(tl.program_id(0), BLOCK_M, M, ncols)
        x, _, _, xn = _normed(x_ptr, i, j, ok, s0, s1, sc, lnw_ptr, lnb_ptr, eps, C, True)
        xn = xn.to(wi_ptr.dtype.element_ty)
        acc = tl.zeros((BLOCK_M, C), dtype=tl.float32)
        hh = tl.arange(0, BLOCK_H)
        c = tl.arange(0, C)
        for h0 in range(0, hidden, BLOCK_H):
            a = tl.dot(xn, _weight_t(wi_ptr, h0, hidden, swi_n, swi_k, C, BLOCK_H), input_precision=PREC)
            b = tl.dot(xn, _weight_t(wi_ptr, hidden + h0, 2 * hidden, swi_n, swi_k, C, BLOCK_H), input_precision=PREC)
            act = (a * tl.sigmoid(a) * b).to(wo_ptr.dtype.element_ty)
            # W_out[:, h0:h0+BLOCK_H]ᵀ as [BLOCK_H, C]
            wo = tl.load(wo_ptr + c[None, :] * swo_n + (h0 + hh)[:, None] * swo_k)
            acc = tl.dot(act, wo, acc, input_precision=PREC)
        if RESIDUAL:
            acc += x
        tl.store(o_ptr + i[:, None] * o0 + j[:, None] * o1 + c[None, :] * oc, acc.to(o_ptr.dtype.element_ty),
                 mask=ok[:, None])


def _as3(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[R, N, C]``: a 2D ``[rows, C]`` gets R=1 (a view; strides kept)."""
    return t.unsqueeze(0) if t.dim() == 2 else t


def _launch(kernel: str, t: torch.Tensor) -> dict:
    """``kernel``'s launch settings for ``t``'s dtype: ``TILES[kernel]``, or ``FP32_TILES``'s rows and
    stages in fp32."""
    return {**TILES[kernel], **FP32_TILES} if t.dtype == torch.float32 else dict(TILES[kernel])


def _prec(t: torch.Tensor) -> str:
    """``tl.dot``'s input precision: exact for fp32 (no TF32: the parity reference), else the
    tensor cores' native bf16/fp16."""
    return "ieee" if t.dtype == torch.float32 else "tf32"


def _grid_rows(M: int, block_m: int) -> int:
    return triton.cdiv(M, block_m)


def interpreted() -> bool:
    """Whether Triton runs its interpreter (``TRITON_INTERPRET=1``: CPU tensors, the tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def usable(t: torch.Tensor, channels: int) -> bool:
    """Whether these kernels can run for ``t`` with ``channels`` channels per row: Triton present,
    ``t`` on CUDA (or interpreted), a power-of-two ``channels`` from 16 to 256, fp32/bf16/fp16."""
    return (HAS_TRITON and (t.is_cuda or interpreted()) and 16 <= channels <= 256
            and channels & (channels - 1) == 0 and t.dtype in (torch.float32, torch.bfloat16, torch.float16))


# Launch settings per kernel in half precision: BLOCK_M rows of all C channels per program, the
# output columns (BLOCK_N) or hidden channels (BLOCK_H, the most: hidden_step) per step of its loop,
# Triton's warps and pipeline stages. The fastest of scripts/tune_triton_passes.py's alternatives on
# one H100 at N=2,048 (2026-12-05: docs/benchmarks/2026-12-05-h100-triton/a/tune.json). The settings
# chosen before on a CPU (8 warps for triangle_update and swiglu_transition, which spilled a few
# registers with 4 when compiled for sm_90: scripts/triton_resources.py) were slower there. The
# transition's 32-channel hidden step with 3 stages, timed on an H100 on 2026-12-06, took 4.99 ms
# against 6.16 for 128 channels and 1 stage (docs/benchmarks/2026-12-06-h100-swiglu/w/tune_swiglu.json).
# The update kernel in 32-channel output steps with 1 stage, timed on an H100 on 2026-12-06, took
# 2.33 ms against 2.57 in one step with 3 stages (docs/benchmarks/2026-12-06-h100-update/w2/tune_update.json).
TILES = {
    "norm_linear": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    "triangle_operands": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=1),
    "triangle_update": dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1),
    "gated_output": dict(BLOCK_M=64, num_warps=4, num_stages=3),
    "swiglu_transition": dict(BLOCK_M=64, BLOCK_H=32, num_warps=4, num_stages=3),
}
# fp32 (the parity reference): 64-row tiles with 3 stages asked 311 KiB of shared memory in
# triangle_operands on an H200 (227 KiB there; 2026-12-05)
FP32_TILES = dict(BLOCK_M=32, num_stages=1)


def hidden_step(hidden: int, block_h: int) -> int | None:
    """The transition kernels' step over ``hidden`` channels: the largest power of two up to
    ``block_h`` (their tuned step) that divides ``hidden``, at least 16 (``tl.dot``'s smallest);
    None where there is none."""
    step = block_h
    while step >= 16 and hidden % step:
        step //= 2
    return step if step >= 16 else None


def swiglu_hidden_ok(hidden: int) -> bool:
    """Whether the transition kernel takes ``hidden`` channels (a step of ``hidden_step`` divides them)."""
    return hidden_step(hidden, TILES["swiglu_transition"]["BLOCK_H"]) is not None


def norm_linear(x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor | None, w: torch.Tensor) -> torch.Tensor:
    """``LayerNorm(x) @ wᵀ``: ``x: [R, N, C]`` or ``[rows, C]``, ``w: [out, C]`` -> ``[..., out]``."""
    x3 = _as3(x)
    R, N, C = x3.shape
    out = torch.empty((*x.shape[:-1], w.shape[0]), dtype=x.dtype, device=x.device)
    o3 = _as3(out)
    M = R * N
    w = w.to(x.dtype)  # before its strides are read: a conversion copies
    tiles = _launch("norm_linear", x)
    tiles["BLOCK_N"] = max(16, min(tiles["BLOCK_N"], triton.next_power_of_2(w.shape[0])))
    _norm_linear_kernel[(_grid_rows(M, tiles["BLOCK_M"]),)](
        x3, *x3.stride(), ln_w, ln_b if ln_b is not None else ln_w, w, *w.stride(),
        o3, *o3.stride(), M, N, w.shape[0], EPS, C=C, HAS_LNB=ln_b is not None, PREC=_prec(x), **tiles)
    return out


def triangle_operands(z: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w: torch.Tensor,
                      mask: torch.Tensor, a_out: torch.Tensor | None = None,
                      b_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``ops.fused.triangle_operands``: ``z: [r, N, C]``, ``w: [4k, C]``, ``mask: [r, N]`` ->
    ``(a, b)`` each ``[k, r, N]`` (into ``a_out``/``b_out`` when given). Needs ``k`` a multiple of 16."""
    r, n, C = z.shape
    k = w.shape[0] // 4
    a = a_out if a_out is not None else z.new_empty((k, r, n))
    b = b_out if b_out is not None else z.new_empty((k, r, n))
    w = w.to(z.dtype)
    tiles = _launch("triangle_operands", z)
    tiles["BLOCK_N"] = min(tiles["BLOCK_N"], k)
    _triangle_operands_kernel[(_grid_rows(r * n, tiles["BLOCK_M"]),)](
        z, *z.stride(), ln_w, ln_b, w, *w.stride(), mask, *mask.stride(),
        a, *a.stride(), b, *b.stride(), r * n, n, k, EPS, C=C, PREC=_prec(z), **tiles)
    return a, b


def operand_channels_ok(k: int) -> bool:
    """Whether ``triangle_operands`` takes a chunk of ``k`` channels (a power of two, 16 at least:
    ``tl.dot``'s smallest tile; its steps of ``min(BLOCK_N, k)`` channels then divide it)."""
    return k >= 16 and k & (k - 1) == 0


def triangle_update(x: torch.Tensor, z: torch.Tensor, ln_x_w: torch.Tensor, ln_x_b: torch.Tensor,
                    ln_z_w: torch.Tensor, ln_z_b: torch.Tensor, w_out: torch.Tensor, w_gate: torch.Tensor,
                    residual: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """``ops.fused.triangle_update``: ``x: [r, N, c]`` (any strides), ``z: [r, N, C]`` ->
    ``[r, N, C]``; with ``residual`` the sum, written into ``out`` when given (autograd), else into ``z``."""
    r, n, C = z.shape
    out = out if out is not None else z if residual else torch.empty_like(z)
    w_out, w_gate = w_out.to(z.dtype), w_gate.to(z.dtype)
    tiles = _launch("triangle_update", z)
    tiles["BLOCK_N"] = min(tiles["BLOCK_N"], C)  # C or more: one step
    _triangle_update_kernel[(_grid_rows(r * n, tiles["BLOCK_M"]),)](
        x, *x.stride(), z, *z.stride(), ln_x_w, ln_x_b, ln_z_w, ln_z_b, w_out, *w_out.stride(),
        w_gate, *w_gate.stride(), out, *out.stride(), r * n, n, EPS, CX=x.shape[-1], C=C,
        RESIDUAL=residual, PREC=_prec(z), **tiles)
    return out


def gated_output(o: torch.Tensor, g: torch.Tensor, w_out: torch.Tensor, acc: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """``ops.fused.gated_output``: ``o, g: [r, N, K]`` -> ``[r, N, C]``; with ``acc`` the sum,
    written into ``out`` when given (autograd), else into ``acc``."""
    o3, g3 = _as3(o), _as3(g)
    R, N, K = o3.shape
    C = w_out.shape[0]
    if out is None:
        out = acc if acc is not None else torch.empty((*o.shape[:-1], C), dtype=o.dtype, device=o.device)
    u3 = _as3(out)
    a3 = u3 if acc is None else _as3(acc)
    w_out = w_out.to(o.dtype)
    tiles = _launch("gated_output", o)
    _gated_output_kernel[(_grid_rows(R * N, tiles["BLOCK_M"]),)](
        o3, *o3.stride(), g3, *g3.stride(), w_out, *w_out.stride(), a3, *a3.stride(), u3, *u3.stride(),
        R * N, N, K=K, C=C, RESIDUAL=acc is not None, PREC=_prec(o), **tiles)
    return out


def swiglu_transition(x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w_in: torch.Tensor,
                      w_out: torch.Tensor, residual: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """``ops.fused.swiglu_transition``: ``x: [r, N, C]`` or ``[rows, C]``, ``w_in: [2H, C]``,
    ``w_out: [C, H]`` -> ``[..., C]``; with ``residual`` the sum, written into ``out`` when given
    (autograd), else into ``x``."""
    x3 = _as3(x)
    R, N, C = x3.shape
    hidden = w_out.shape[1]
    out = out if out is not None else x if residual else torch.empty_like(x)
    o3 = _as3(out)
    w_in, w_out = w_in.to(x.dtype), w_out.to(x.dtype)
    tiles = _launch("swiglu_transition", x)
    tiles["BLOCK_H"] = hidden_step(hidden, tiles["BLOCK_H"])
    _swiglu_kernel[(_grid_rows(R * N, tiles["BLOCK_M"]),)](
        x3, *x3.stride(), ln_w, ln_b, w_in, *w_in.stride(), w_out, *w_out.stride(),
        o3, *o3.stride(), R * N, N, hidden, EPS, C=C, RESIDUAL=residual, PREC=_prec(x), **tiles)
    return out
