"""The Triton passes under autograd: each op of ``ops/triton_passes.py`` as a
``torch.autograd.Function`` whose forward is that kernel and whose backward is one Triton kernel
per op plus cuBLAS for the weight gradients (``model.passes=triton`` in training).

The forward saves only its inputs (the activation checkpoints of the trunk keep nothing more).
The backward kernel loads a tile of ``BLOCK_M`` rows, recomputes the LayerNorm and whatever the
op's gates need from them (the projections, with ``tl.dot``), turns the output gradient into the
gradient of the pre-activations, multiplies it back through the weights into the normalised
input's gradient, and finishes the LayerNorm backward in registers, so neither the normalised
input's gradient nor the recomputed projections reach memory. It writes the input gradient, per
program the LayerNorm parameters' partial sums, and the two operands of each weight gradient
(the pre-activation gradient and the normalised input, row-major), which one ``torch.matmul``
per weight then reduces over the rows: a reduction over millions of rows that cuBLAS does well
and that a kernel would do with atomics or a second pass.

Per op, with ``LN(x) = x̂·γ + β``, ``x̂ = (x − μ)·rstd``, and ``dy`` the output gradient:

* ``norm_linear``, ``y = LN(x) Wᵀ``: ``dx̂n = dy W``; ``dW = dyᵀ LN(x)``;
* ``gated_output``, ``y = (o·σ(g)) Wᵀ``: ``dh = dy W``, ``do = dh·σ(g)``, ``dg = dh·o·σ'(g)``,
  ``dW = dyᵀ (o·σ(g))``;
* ``swiglu_transition``, ``y = (silu(a)·b) W_outᵀ``, ``[a; b] = LN(x) W_inᵀ``: per chunk of hidden
  channels ``d(act) = dy W_out``, ``da = d(act)·b·silu'(a)``, ``db = d(act)·silu(a)``, ``dx̂n +=
  [da db] W_in``; ``dW_out = dyᵀ act``, ``dW_in = [da db]ᵀ LN(x)``;
* ``triangle_operands``, ``a = (LN(z) W_paᵀ)·σ(LN(z) W_gaᵀ)·mask`` (and b): ``dpa = da·σ(ga)·mask``,
  ``dga = da·pa·mask·σ'(ga)``, ``dẑn = [dpa dpb dga dgb] W``, ``dW = [dpa dpb dga dgb]ᵀ LN(z)``;
* ``triangle_update``, ``y = (LN_x(x) W_oᵀ)·σ(LN_z(z) W_gᵀ)``: ``dO = dy·σ(G)``, ``dG = dy·O·σ'(G)``,
  ``dx̂n = dO W_o``, ``dẑn = dG W_g``; ``dW_o = dOᵀ LN_x(x)``, ``dW_g = dGᵀ LN_z(z)``.

The LayerNorm backward of a row: ``dx = rstd·(dx̂n·γ − mean(dx̂n·γ) − x̂·mean(dx̂n·γ·x̂))``,
``dγ = Σ dx̂n·x̂``, ``dβ = Σ dx̂n``. Shapes as in ``ops/triton_passes.py`` (per rank, any strides).

Residuals stay out of place but cost no pass of their own: with ``residual`` (``swiglu_transition``,
``triangle_update``) or ``acc`` (``gated_output``) the forward kernel writes input plus update into a
new tensor, and the backward adds ``dy`` into the input's gradient in the LayerNorm epilogue (``dx =
dy + ...``) or passes ``dy`` on as ``acc``'s gradient. Otherwise autograd adds the update in one pass
over z and the two gradients of z in another, each a pass per op in the forward, its recomputes and
the backward (on an H100, 2026-12-06, the training step's adds were 7 % of its kernel time; on the
transposed views of the Z^T ops the adds run strided). No in-place form (output buffers). The parity tests
(``tests/unit/test_triton_backward.py``) compare every gradient with the eager functions' autograd
in Triton's interpreter.
"""

from __future__ import annotations

import torch

from cpbench.models.pairformer.ops import triton_passes as tp

if tp.HAS_TRITON:
    import triton
    import triton.language as tl

    from cpbench.models.pairformer.ops.triton_passes import _normed, _rows, _weight_t

    @triton.jit
    def _weight(w_ptr, n0, n_out, swn, swk, K: tl.constexpr, BLOCK_N: tl.constexpr):
        """``w[n0:n0+BLOCK_N, :K]`` as ``[BLOCK_N, K]`` (rows past ``n_out`` read as 0)."""
        n = n0 + tl.arange(0, BLOCK_N)
        k = tl.arange(0, K)
        return tl.load(w_ptr + n[:, None] * swn + k[None, :] * swk, mask=(n < n_out)[:, None], other=0.0)

    @triton.jit
    def _ln_backward(dxn, xhat, rstd, lnw_ptr, dx_ptr, i, j, ok, d0, d1, dc, part_ptr, pid,
                     res_ptr, r0, r1, rc, C: tl.constexpr, HAS_RES: tl.constexpr):
        """Store the input gradient of the tile and this program's partial ``(dγ, dβ)`` sums
        (``part_ptr``: ``[programs, 2, C]`` fp32); with ``HAS_RES`` plus the tile of ``res_ptr``
        (the gradient of a residual path through the same input: the op's output gradient)."""
        c = tl.arange(0, C)
        wdy = dxn * tl.load(lnw_ptr + c).to(tl.float32)[None, :]
        c1 = tl.sum(xhat * wdy, axis=1) / C
        c2 = tl.sum(wdy, axis=1) / C
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        if HAS_RES:
            dx += tl.load(res_ptr + i[:, None] * r0 + j[:, None] * r1 + c[None, :] * rc, mask=ok[:, None],
                          other=0.0).to(tl.float32)
        tl.store(dx_ptr + i[:, None] * d0 + j[:, None] * d1 + c[None, :] * dc, dx.to(dx_ptr.dtype.element_ty),
                 mask=ok[:, None])
        tl.store(part_ptr + pid * 2 * C + c, tl.sum(dxn * xhat, axis=0))
        tl.store(part_ptr + pid * 2 * C + C + c, tl.sum(dxn, axis=0))

    @triton.jit
    def _store_rows(ptr, m, ok, col0, ncols_total, val, BLOCK_N: tl.constexpr):
        """``val`` ``[BLOCK_M, BLOCK_N]`` into columns ``[col0, col0+BLOCK_N)`` of a row-major
        ``[M, ncols_total]`` buffer at rows ``m``."""
        n = col0 + tl.arange(0, BLOCK_N)
        tl.store(ptr + m[:, None] * ncols_total + n[None, :], val.to(ptr.dtype.element_ty), mask=ok[:, None])

    @triton.jit
    def _norm_linear_bwd(x_ptr, s0, s1, sc, lnw_ptr, lnb_ptr, w_ptr, swn, swk, dy_ptr, y0, y1, yc,
                         dx_ptr, d0, d1, dc, xn_ptr, part_ptr, M, ncols, n_out, eps,
                         C: tl.constexpr, HAS_LNB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         PREC: tl.constexpr):
        pid = tl.program_id(0)
        i, j, ok = _rows(pid, BLOCK_M, M, ncols)
        m = i * ncols + j
        _, xhat, rstd, xn = _normed(x_ptr, i, j, ok, s0, s1, sc, lnw_ptr, lnb_ptr, eps, C, HAS_LNB)
        _store_rows(xn_ptr, m, ok, 0, C, xn, C)
        dxn = tl.zeros((BLOCK_M, C), dtype=tl.float32)
        for n0 in range(0, n_out, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            dy = tl.load(dy_ptr + i[:, None] * y0 + j[:, None] * y1 + n[None, :] * yc,
                         mask=ok[:, None] & (n < n_out)[None, :], other=0.0)
            w = _weight(w_ptr, n0, n_out, swn, swk, C, BLOCK_N)
            dxn = tl.dot(dy.to(w.dtype), w, dxn, input_precision=PREC)
        _ln_backward(dxn, xhat, rstd, lnw_ptr, dx_ptr, i, j, ok, d0, d1, dc, part_ptr, pid, dx_ptr, d0, d1, dc, C,
                     False)

    @triton.jit
    def _gated_output_bwd(o_ptr, q0, q1, qc, g_ptr, g0, g1, gc, w_ptr, swn, swk, dy_ptr, y0, y1, yc,
                          do_ptr, e0, e1, ec, dg_ptr, f0, f1, fc, h_ptr, M, ncols,
                          K: tl.constexpr, C: tl.constexpr, BLOCK_M: tl.constexpr, PREC: tl.constexpr):
        i, j, ok = _rows(tl.program_id(0), BLOCK_M, M, ncols)
        m = i * ncols + j
        k = tl.arange(0, K)
        c = tl.arange(0, C)
        o = tl.load(o_ptr + i[:, None] * q0 + j[:, None] * q1 + k[None, :] * qc, mask=ok[:, None], other=0.0)
        g = tl.load(g_ptr + i[:, None] * g0 + j[:, None] * g1 + k[None, :] * gc, mask=ok[:, None], other=0.0)
        o, sg = o.to(tl.float32), tl.sigmoid(g.to(tl.float32))
        _store_rows(h_ptr, m, ok, 0, K, o * sg, K)
        dy = tl.load(dy_ptr + i[:, None] * y0 + j[:, None] * y1 + c[None, :] * yc, mask=ok[:, None], other=0.0)
        w = _weight(w_ptr, 0, C, swn, swk, K, C)  # [C, K]
        dh = tl.dot(dy.to(w.dtype), w, input_precision=PREC)
        tl.store(do_ptr + i[:, None] * e0 + j[:, None] * e1 + k[None, :] * ec, (dh * sg).to(do_ptr.dtype.element_ty),
                 mask=ok[:, None])
        tl.store(dg_ptr + i[:, None] * f0 + j[:, None] * f1 + k[None, :] * fc,
                 (dh * o * sg * (1.0 - sg)).to(dg_ptr.dtype.element_ty), mask=ok[:, None])

    @triton.jit
    def _swiglu_bwd(x_ptr, s0, s1, sc, lnw_ptr, lnb_ptr, wi_ptr, swi_n, swi_k, wo_ptr, swo_n, swo_k,
                    dy_ptr, y0, y1, yc, dx_ptr, d0, d1, dc, xn_ptr, act_ptr, dab_ptr, part_ptr, M, ncols, hidden, eps,
                    C: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
                    PREC: tl.constexpr):
        """With ``RESIDUAL`` (the output was ``x`` plus the update) ``dx`` gets the output gradient too."""
        pid = tl.program_id(0)
        i, j, ok = _rows(pid, BLOCK_M, M, ncols)
        m = i * ncols + j
        c = tl.arange(0, C)
        hh = tl.arange(0, BLOCK_H)
        _, xhat, rstd, xn = _normed(x_ptr, i, j, ok, s0, s1, sc, lnw_ptr, lnb_ptr, eps, C, True)
        _store_rows(xn_ptr, m, ok, 0, C, xn, C)
        xn = xn.to(wi_ptr.dtype.element_ty)
        dy = tl.load(dy_ptr + i[:, None] * y0 + j[:, None] * y1 + c[None, :] * yc, mask=ok[:, None], other=0.0)
        dy = dy.to(wo_ptr.dtype.element_ty)
        dxn = tl.zeros((BLOCK_M, C), dtype=tl.float32)
        for h0 in range(0, hidden, BLOCK_H):
            a = tl.dot(xn, _weight_t(wi_ptr, h0, hidden, swi_n, swi_k, C, BLOCK_H), input_precision=PREC)
            b = tl.dot(xn, _weight_t(wi_ptr, hidden + h0, 2 * hidden, swi_n, swi_k, C, BLOCK_H), input_precision=PREC)
            sa = tl.sigmoid(a)
            silu = a * sa
            _store_rows(act_ptr, m, ok, h0, hidden, silu * b, BLOCK_H)
            # W_out[:, h0:h0+BLOCK_H] as [C, BLOCK_H]
            wo = tl.load(wo_ptr + c[:, None] * swo_n + (h0 + hh)[None, :] * swo_k)
            dact = tl.dot(dy, wo, input_precision=PREC)
            da = dact * b * (sa + a * sa * (1.0 - sa))
            db = dact * silu
            _store_rows(dab_ptr, m, ok, h0, 2 * hidden, da, BLOCK_H)
            _store_rows(dab_ptr, m, ok, hidden + h0, 2 * hidden, db, BLOCK_H)
            wa = _weight(wi_ptr, h0, 2 * hidden, swi_n, swi_k, C, BLOCK_H)
            wb = _weight(wi_ptr, hidden + h0, 2 * hidden, swi_n, swi_k, C, BLOCK_H)
            dxn = tl.dot(da.to(wa.dtype), wa, dxn, input_precision=PREC)
            dxn = tl.dot(db.to(wb.dtype), wb, dxn, input_precision=PREC)
        _ln_backward(dxn, xhat, rstd, lnw_ptr, dx_ptr, i, j, ok, d0, d1, dc, part_ptr, pid, dy_ptr, y0, y1, yc, C,
                     RESIDUAL)

    @triton.jit
    def _triangle_operands_bwd(z_ptr, s0, s1, sc, lnw_ptr, lnb_ptr, w_ptr, swn, swk, mask_ptr, m0, m1,
                               da_ptr, a0, a1, a2, db_ptr, b0, b1, b2, dz_ptr, d0, d1, dc, zn_ptr, dp_ptr, part_ptr,
                               M, ncols, k_ch, eps, C: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               PREC: tl.constexpr):
        """``dp_ptr``: ``[M, 4k]`` row-major, the gradients of the four projections in ``w``'s row order."""
        pid = tl.program_id(0)
        i, j, ok = _rows(pid, BLOCK_M, M, ncols)
        m = i * ncols + j
        _, _, _, zn = _normed(z_ptr, i, j, ok, s0, s1, sc, lnw_ptr, lnb_ptr, eps, C, True)
        _store_rows(zn_ptr, m, ok, 0, C, zn, C)
        zn = zn.to(w_ptr.dtype.element_ty)
        mask = tl.load(mask_ptr + i * m0 + j * m1, mask=ok, other=0.0).to(tl.float32)[:, None]
        dzn = tl.zeros((BLOCK_M, C), dtype=tl.float32)
        for n0 in range(0, k_ch, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            for side in tl.static_range(2):  # a, then b
                if side == 0:
                    g_ptr, p0, p1, p2 = da_ptr, a0, a1, a2
                else:
                    g_ptr, p0, p1, p2 = db_ptr, b0, b1, b2
                row_p = side * k_ch + n0          # this side's projection rows in w
                row_g = (2 + side) * k_ch + n0    # and its gate's
                p = tl.dot(zn, _weight_t(w_ptr, row_p, 4 * k_ch, swn, swk, C, BLOCK_N), input_precision=PREC)
                s = tl.sigmoid(tl.dot(zn, _weight_t(w_ptr, row_g, 4 * k_ch, swn, swk, C, BLOCK_N), input_precision=PREC))
                grad = tl.load(g_ptr + n[None, :] * p0 + i[:, None] * p1 + j[:, None] * p2, mask=ok[:, None],
                               other=0.0).to(tl.float32) * mask
                dp = grad * s
                dg = grad * p * s * (1.0 - s)
                _store_rows(dp_ptr, m, ok, row_p, 4 * k_ch, dp, BLOCK_N)
                _store_rows(dp_ptr, m, ok, row_g, 4 * k_ch, dg, BLOCK_N)
                wp = _weight(w_ptr, row_p, 4 * k_ch, swn, swk, C, BLOCK_N)
                wg = _weight(w_ptr, row_g, 4 * k_ch, swn, swk, C, BLOCK_N)
                dzn = tl.dot(dp.to(wp.dtype), wp, dzn, input_precision=PREC)
                dzn = tl.dot(dg.to(wg.dtype), wg, dzn, input_precision=PREC)
        # the normalised tile again (a second read of z), rather than kept live across the loop: the
        # kernel spilled registers with it on sm_90 (scripts/triton_resources.py)
        _, zhat, rstd, _ = _normed(z_ptr, i, j, ok, s0, s1, sc, lnw_ptr, lnb_ptr, eps, C, True)
        _ln_backward(dzn, zhat, rstd, lnw_ptr, dz_ptr, i, j, ok, d0, d1, dc, part_ptr, pid, dz_ptr, d0, d1, dc, C,
                     False)

    @triton.jit
    def _triangle_update_bwd(x_ptr, x0, x1, xc, z_ptr, z0, z1, zc, lnxw_ptr, lnxb_ptr, lnzw_ptr, lnzb_ptr,
                             wo_ptr, swo_n, swo_k, wg_ptr, swg_n, swg_k, dy_ptr, y0, y1, yc,
                             dx_ptr, e0, e1, ec, dz_ptr, f0, f1, fc, xn_ptr, zn_ptr, do_ptr, dgate_ptr,
                             part_x_ptr, part_z_ptr, M, ncols, eps, CX: tl.constexpr, C: tl.constexpr,
                             RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, PREC: tl.constexpr):
        """With ``RESIDUAL`` (the output was ``z`` plus the update) ``dz`` gets the output gradient too."""
        pid = tl.program_id(0)
        i, j, ok = _rows(pid, BLOCK_M, M, ncols)
        m = i * ncols + j
        c = tl.arange(0, C)
        _, xhat, xrstd, xn = _normed(x_ptr, i, j, ok, x0, x1, xc, lnxw_ptr, lnxb_ptr, eps, CX, True)
        _, zhat, zrstd, zn = _normed(z_ptr, i, j, ok, z0, z1, zc, lnzw_ptr, lnzb_ptr, eps, C, True)
        _store_rows(xn_ptr, m, ok, 0, CX, xn, CX)
        _store_rows(zn_ptr, m, ok, 0, C, zn, C)
        wo_t = _weight_t(wo_ptr, 0, C, swo_n, swo_k, CX, C)   # [CX, C]
        wg_t = _weight_t(wg_ptr, 0, C, swg_n, swg_k, C, C)    # [C, C]
        o = tl.dot(xn.to(wo_t.dtype), wo_t, input_precision=PREC)
        s = tl.sigmoid(tl.dot(zn.to(wg_t.dtype), wg_t, input_precision=PREC))
        dy = tl.load(dy_ptr + i[:, None] * y0 + j[:, None] * y1 + c[None, :] * yc, mask=ok[:, None],
                     other=0.0).to(tl.float32)
        d_o = dy * s
        d_g = dy * o * s * (1.0 - s)
        _store_rows(do_ptr, m, ok, 0, C, d_o, C)
        _store_rows(dgate_ptr, m, ok, 0, C, d_g, C)
        wo = _weight(wo_ptr, 0, C, swo_n, swo_k, CX, C)      # [C, CX]
        wg = _weight(wg_ptr, 0, C, swg_n, swg_k, C, C)       # [C, C]
        dxn = tl.dot(d_o.to(wo.dtype), wo, input_precision=PREC)
        dzn = tl.dot(d_g.to(wg.dtype), wg, input_precision=PREC)
        _ln_backward(dxn, xhat, xrstd, lnxw_ptr, dx_ptr, i, j, ok, e0, e1, ec, part_x_ptr, pid, dx_ptr, e0, e1, ec,
                     CX, False)
        _ln_backward(dzn, zhat, zrstd, lnzw_ptr, dz_ptr, i, j, ok, f0, f1, fc, part_z_ptr, pid, dy_ptr, y0, y1, yc,
                     C, RESIDUAL)


def _grid(M: int, block_m: int) -> int:
    return triton.cdiv(M, block_m)


def _partials(programs: int, c: int, like: torch.Tensor) -> torch.Tensor:
    return torch.empty((programs, 2, c), dtype=torch.float32, device=like.device)


def _ln_grads(part: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor | None):
    """``(dγ, dβ)`` from the programs' partial sums (``dβ`` None without a bias)."""
    sums = part.sum(0)
    return sums[0].to(ln_w.dtype), (sums[1].to(ln_b.dtype) if ln_b is not None else None)


def _weight_grad(grad_rows: torch.Tensor, inp_rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``grad_rowsᵀ @ inp_rows`` (``[M, out]``, ``[M, in]`` -> ``[out, in]``) in ``w``'s dtype."""
    return torch.matmul(grad_rows.t(), inp_rows).to(w.dtype)


# Launch settings of the backward kernels in half precision: the fastest of each kernel's grid, timed
# at N=2,048 on one H100 (scripts/tune_triton_passes.py, 2026-12-05,
# docs/benchmarks/2026-12-05-h100-r2/tune_bwd.json; the H200 is the same sm_90 with 132 SMs), ms per
# call against the earlier settings: norm_linear 6.14 (8.36), triangle_operands 11.43 (19.05),
# triangle_update 9.91 (12.48), gated_output 3.53 (4.14), swiglu_transition 20.53 (35.30). The earlier
# settings were chosen on a CPU (scripts/triton_resources.py) as those that keep every register on
# chip (8 warps); the 4-warp ones spill 120-550 bytes per thread there and are faster all the same.
# swiglu_transition with 64 rows stopped at an illegal memory access on that GPU (every later setting
# of that run then failed with it): 32 rows, as before, and the cause is not known yet.
BWD_TILES = {
    "norm_linear": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
    "triangle_operands": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=1),
    "triangle_update": dict(BLOCK_M=32, num_warps=4, num_stages=1),
    "gated_output": dict(BLOCK_M=64, num_warps=4, num_stages=1),
    # the hidden step validated on an H100 (2026-12-05, kernel_parity): 64; hidden_step picks a
    # smaller one where it does not divide the hidden channels
    "swiglu_transition": dict(BLOCK_M=32, BLOCK_H=64, num_warps=4, num_stages=2),
}
# fp32 (the parity reference): 32-row tiles and one stage (shared memory: swiglu_transition's
# backward asks 200 KiB of the 227 at two stages, compiled for sm_90 with Triton 3.9 on a CPU)
BWD_FP32_TILES = dict(BLOCK_M=32, num_stages=1)


def _launch(kernel: str, t: torch.Tensor) -> dict:
    """``kernel``'s backward launch settings for ``t``'s dtype."""
    return {**BWD_TILES[kernel], **(BWD_FP32_TILES if t.dtype == torch.float32 else {})}


def _3d(t: torch.Tensor) -> torch.Tensor:
    return tp._as3(t)


def _ln_buffers(kernel: str, x: torch.Tensor, M: int, C: int) -> tuple[torch.Tensor, torch.Tensor, dict, int, torch.Tensor]:
    """What the backward of an op that normalises ``x`` (``M`` rows of ``C`` channels) allocates:
    ``dx`` (``x``'s shape), the normalised rows ``xn: [M, C]`` (the weight gradient's operand),
    ``kernel``'s launch settings, its program count and their partial LayerNorm sums."""
    tiles = _launch(kernel, x)
    programs = _grid(M, tiles["BLOCK_M"])
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty((M, C), dtype=x.dtype, device=x.device),
            tiles, programs, _partials(programs, C, x))


class _NormLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ln_w, ln_b, w):
        ctx.save_for_backward(x, ln_w, ln_b, w)
        return tp.norm_linear(x, ln_w, ln_b, w)

    @staticmethod
    def backward(ctx, dy):
        x, ln_w, ln_b, w = ctx.saved_tensors
        x3, dy3 = _3d(x), _3d(dy)
        R, N, C = x3.shape
        M = R * N
        wc = w.to(x.dtype)
        dx, xn, tiles, programs, part = _ln_buffers("norm_linear", x, M, C)
        tiles["BLOCK_N"] = max(16, min(tiles["BLOCK_N"], triton.next_power_of_2(w.shape[0])))
        dx3 = _3d(dx)
        _norm_linear_bwd[(programs,)](
            x3, *x3.stride(), ln_w, ln_b if ln_b is not None else ln_w, wc, *wc.stride(), dy3, *dy3.stride(),
            dx3, *dx3.stride(), xn, part, M, N, w.shape[0], tp.EPS, C=C, HAS_LNB=ln_b is not None,
            PREC=tp._prec(x), **tiles)
        d_lnw, d_lnb = _ln_grads(part, ln_w, ln_b)
        return dx, d_lnw, d_lnb, _weight_grad(dy.reshape(M, -1), xn, w)


class _GatedOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o, g, w, acc):
        ctx.save_for_backward(o, g, w)
        if acc is None:
            return tp.gated_output(o, g, w)
        return tp.gated_output(o, g, w, acc, out=torch.empty_like(acc))

    @staticmethod
    def backward(ctx, dy):
        o, g, w = ctx.saved_tensors
        o3, g3, dy3 = _3d(o), _3d(g), _3d(dy)
        R, N, K = o3.shape
        M = R * N
        wc = w.to(o.dtype)
        d_o, d_g = torch.empty(o.shape, dtype=o.dtype, device=o.device), torch.empty(g.shape, dtype=g.dtype, device=g.device)
        do3, dg3 = _3d(d_o), _3d(d_g)
        h = torch.empty((M, K), dtype=o.dtype, device=o.device)
        tiles = _launch("gated_output", o)
        _gated_output_bwd[(_grid(M, tiles["BLOCK_M"]),)](
            o3, *o3.stride(), g3, *g3.stride(), wc, *wc.stride(), dy3, *dy3.stride(), do3, *do3.stride(),
            dg3, *dg3.stride(), h, M, N, K=K, C=w.shape[0], PREC=tp._prec(o), **tiles)
        return d_o, d_g, _weight_grad(dy.reshape(M, -1), h, w), dy if ctx.needs_input_grad[3] else None


class _SwigluTransition(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ln_w, ln_b, w_in, w_out, residual):
        ctx.save_for_backward(x, ln_w, ln_b, w_in, w_out)
        ctx.residual = residual
        return tp.swiglu_transition(x, ln_w, ln_b, w_in, w_out, residual, out=torch.empty_like(x))

    @staticmethod
    def backward(ctx, dy):
        x, ln_w, ln_b, w_in, w_out = ctx.saved_tensors
        x3, dy3 = _3d(x), _3d(dy)
        R, N, C = x3.shape
        M, hidden = R * N, w_out.shape[1]
        wi, wo = w_in.to(x.dtype), w_out.to(x.dtype)
        dx, xn, tiles, programs, part = _ln_buffers("swiglu_transition", x, M, C)
        tiles["BLOCK_H"] = tp.hidden_step(hidden, tiles["BLOCK_H"])
        dx3 = _3d(dx)
        act = torch.empty((M, hidden), dtype=x.dtype, device=x.device)
        dab = torch.empty((M, 2 * hidden), dtype=x.dtype, device=x.device)
        _swiglu_bwd[(programs,)](
            x3, *x3.stride(), ln_w, ln_b, wi, *wi.stride(), wo, *wo.stride(), dy3, *dy3.stride(),
            dx3, *dx3.stride(), xn, act, dab, part, M, N, hidden, tp.EPS, C=C, RESIDUAL=ctx.residual,
            PREC=tp._prec(x), **tiles)
        d_lnw, d_lnb = _ln_grads(part, ln_w, ln_b)
        return dx, d_lnw, d_lnb, _weight_grad(dab, xn, w_in), _weight_grad(dy.reshape(M, -1), act, w_out), None


class _TriangleOperands(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, ln_w, ln_b, w, mask):
        ctx.save_for_backward(z, ln_w, ln_b, w, mask)
        return tp.triangle_operands(z, ln_w, ln_b, w, mask)

    @staticmethod
    def backward(ctx, da, db):
        z, ln_w, ln_b, w, mask = ctx.saved_tensors
        r, n, C = z.shape
        M, k = r * n, w.shape[0] // 4
        da = da if da is not None else z.new_zeros((k, r, n))
        db = db if db is not None else z.new_zeros((k, r, n))
        wc = w.to(z.dtype)
        dz, zn, tiles, programs, part = _ln_buffers("triangle_operands", z, M, C)
        tiles["BLOCK_N"] = min(tiles["BLOCK_N"], k)
        dp = torch.empty((M, 4 * k), dtype=z.dtype, device=z.device)
        _triangle_operands_bwd[(programs,)](
            z, *z.stride(), ln_w, ln_b, wc, *wc.stride(), mask, *mask.stride(), da, *da.stride(), db, *db.stride(),
            dz, *dz.stride(), zn, dp, part, M, n, k, tp.EPS, C=C, PREC=tp._prec(z), **tiles)
        d_lnw, d_lnb = _ln_grads(part, ln_w, ln_b)
        return dz, d_lnw, d_lnb, _weight_grad(dp, zn, w), None


class _TriangleUpdate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, z, ln_x_w, ln_x_b, ln_z_w, ln_z_b, w_out, w_gate, residual):
        ctx.save_for_backward(x, z, ln_x_w, ln_x_b, ln_z_w, ln_z_b, w_out, w_gate)
        ctx.residual = residual
        return tp.triangle_update(x, z, ln_x_w, ln_x_b, ln_z_w, ln_z_b, w_out, w_gate, residual,
                                  out=torch.empty_like(z))

    @staticmethod
    def backward(ctx, dy):
        x, z, ln_x_w, ln_x_b, ln_z_w, ln_z_b, w_out, w_gate = ctx.saved_tensors
        r, n, C = z.shape
        CX, M = x.shape[-1], r * n
        wo, wg = w_out.to(z.dtype), w_gate.to(z.dtype)
        dx = torch.empty_like(x)  # x's strides (the product's channel-first layout)
        dz = torch.empty(z.shape, dtype=z.dtype, device=z.device)
        xn = torch.empty((M, CX), dtype=z.dtype, device=z.device)
        zn = torch.empty((M, C), dtype=z.dtype, device=z.device)
        d_o = torch.empty((M, C), dtype=z.dtype, device=z.device)
        d_g = torch.empty((M, C), dtype=z.dtype, device=z.device)
        tiles = _launch("triangle_update", z)
        programs = _grid(M, tiles["BLOCK_M"])
        part_x, part_z = _partials(programs, CX, z), _partials(programs, C, z)
        _triangle_update_bwd[(programs,)](
            x, *x.stride(), z, *z.stride(), ln_x_w, ln_x_b, ln_z_w, ln_z_b, wo, *wo.stride(), wg, *wg.stride(),
            dy, *dy.stride(), dx, *dx.stride(), dz, *dz.stride(), xn, zn, d_o, d_g, part_x, part_z, M, n, tp.EPS,
            CX=CX, C=C, RESIDUAL=ctx.residual, PREC=tp._prec(z), **tiles)
        dxw, dxb = _ln_grads(part_x, ln_x_w, ln_x_b)
        dzw, dzb = _ln_grads(part_z, ln_z_w, ln_z_b)
        return dx, dz, dxw, dxb, dzw, dzb, _weight_grad(d_o, xn, w_out), _weight_grad(d_g, zn, w_gate), None


def norm_linear(x, ln_w, ln_b, w):
    """``triton_passes.norm_linear`` with autograd."""
    return _NormLinear.apply(x, ln_w, ln_b, w)


def gated_output(o, g, w_out, acc=None):
    """``triton_passes.gated_output`` with autograd; with ``acc``, ``acc`` plus the update in a new
    tensor (one pass: no separate add, and ``acc``'s gradient is the output's, passed on)."""
    return _GatedOutput.apply(o, g, w_out, acc)


def swiglu_transition(x, ln_w, ln_b, w_in, w_out, residual=False):
    """``triton_passes.swiglu_transition`` with autograd; with ``residual``, ``x`` plus the update
    in a new tensor, and ``x``'s gradient summed in the backward kernel (no separate adds)."""
    return _SwigluTransition.apply(x, ln_w, ln_b, w_in, w_out, residual)


def triangle_operands(z, ln_w, ln_b, w, mask, a_out=None, b_out=None):
    """``triton_passes.triangle_operands`` (no output buffers: under autograd the operands are new
    tensors, and ``ops/fused.py`` sends calls with buffers to its compiled regions) with autograd;
    ``mask`` gets no gradient."""
    named = [name for name, buf in (("a_out", a_out), ("b_out", b_out)) if buf is not None]
    if named:
        raise ValueError(f"the Triton passes under autograd run out of place only; got {', '.join(named)}")
    return _TriangleOperands.apply(z, ln_w, ln_b, w, mask)


def triangle_update(x, z, ln_x_w, ln_x_b, ln_z_w, ln_z_b, w_out, w_gate, residual=False):
    """``triton_passes.triangle_update`` with autograd; with ``residual``, ``z`` plus the update in
    a new tensor, and ``z``'s gradient summed in the backward kernel (no separate adds)."""
    return _TriangleUpdate.apply(x, z, ln_x_w, ln_x_b, ln_z_w, ln_z_b, w_out, w_gate, residual)
