"""The triangle product ``x[c, i, j] = sum_k left[c, i, k] · right[c, j, k]`` on a sharded pair
tensor: the matmul inside triangle multiplication (``layers/trimul.py``).

* serial: one batched matmul over channels.
* 1d: ``left: [c, N/P, N]`` is local, ``right`` is all-gathered in row chunks so that no rank
  ever holds a full ``N x N x c`` operand; ``(P-1)·|right|`` bytes sent per rank (and as much
  again in backward, plus a reduce-scatter of the same volume).
* 2d: ``[c, N/cp0, N/cp1]`` tiles; ``right`` is grid-transposed, then multiplied by the
  generalised Cannon walk (``parallel/ring.py``): ``≈ N²·c·(1/cp0 + 1/cp1)`` elements sent
  per rank, i.e. ``2·N²·c/√P`` on a square grid; backward twice that plus the return of the
  travelling gradients.
"""

from __future__ import annotations

import torch

from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.grid import Grid
from cpbench.models.pairformer.parallel.layout import TWO_D, Layout
from cpbench.models.pairformer.parallel.ring import RingWalk
from cpbench.models.pairformer.parallel.transpose import transpose_tiles


def _gathered_product_into(out: torch.Tensor, left: torch.Tensor, right: torch.Tensor, layout: Layout) -> None:
    """1d triangle product: ``out[c, i, j] = sum_k left[c, i, k] right_all[c, j, k]``.

    ``right`` rows are all-gathered in chunks of ``jc`` local rows (one all-gather per chunk,
    ``(P-1)·c·jc·N`` elements sent); a chunk brings rows ``{r·n + j0..j1}`` of every rank ``r``,
    i.e. output columns ``j0..j1`` of each rank's column block.

    Args:
        out: ``[c, N/P, N]`` written in place.
        left: ``[c, N/P, N]`` local rows (i) by all k.
        right: ``[c, N/P, N]`` local rows (j) by all k.
    """
    p, (c, n_local, n_pad) = layout.size, left.shape
    out_cols = out.view(c, n_local, p, n_local)
    per_row_b = (p * c * n_pad + c * n_local) * left.element_size()
    jc = comm.agree_min(chunking.rows_per_chunk(n_local, per_row_b, chunking.budget_bytes(left) // 2), layout, left)
    for js in chunking.slices(n_local, jc):
        gathered = left.new_empty((p, c, js.stop - js.start, n_pad))
        comm.gather_into(gathered, right[:, js].contiguous(), layout)
        for r in range(p):  # one matmul per source rank, written in place: no copy of the gathered
            # chunk, none of the result (the strided [c, N/P, jc] view is a valid batched-GEMM output)
            torch.matmul(left, gathered[r].transpose(1, 2), out=out_cols[:, :, r, js])


class _GatheredProduct(torch.autograd.Function):
    """Autograd form of ``_gathered_product_into``: saves only the local operands and
    re-gathers ``right`` chunk by chunk in backward (no N x N x c buffer in training either)."""

    @staticmethod
    def forward(ctx, left: torch.Tensor, right: torch.Tensor, layout: Layout) -> torch.Tensor:
        ctx.layout = layout
        ctx.save_for_backward(left, right)
        out = left.new_empty(left.shape)
        _gathered_product_into(out, left, right, layout)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        left, right = ctx.saved_tensors
        layout = ctx.layout
        p, (c, n_local, n_pad) = layout.size, left.shape
        grad_cols = grad_out.contiguous().view(c, n_local, p, n_local)
        grad_left = torch.zeros_like(left)
        grad_right = torch.empty_like(right)
        per_row_b = 3 * p * c * n_pad * left.element_size()
        jc = comm.agree_min(chunking.rows_per_chunk(n_local, per_row_b, chunking.budget_bytes(left) // 2), layout, left)
        for js in chunking.slices(n_local, jc):
            width = js.stop - js.start
            gathered = left.new_empty((p, c, width, n_pad))
            comm.gather_into(gathered, right[:, js].contiguous(), layout)
            # partial[r]: gradient of rank r's rows js of `right` from this rank's output columns
            partial = torch.empty_like(gathered)
            for r in range(p):
                g = grad_cols[:, :, r, js]  # [c, N/P, width]
                grad_left.baddbmm_(g, gathered[r])
                torch.matmul(g.transpose(1, 2), left, out=partial[r])
            del gathered
            mine = left.new_empty((1, c, width, n_pad))
            comm.reduce_scatter_into(mine, partial, layout)
            grad_right[:, js] = mine[0]
        return grad_left, grad_right, None


def triangle_product(left: torch.Tensor, right: torch.Tensor, layout: Layout, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x[c, i, j] = sum_k left[c, i, k] · right[c, j, k]`` over all ``j`` of the pair tensor.

    Args:
        left, right: ``[c, N/P, N]`` (serial: ``[c, N, N]``).
        out: optional ``[c, N/P, N]`` buffer (no autograd only).
    Returns:
        ``[c, N/P, N]``. 1d sends ``(P-1)·|right|`` bytes (and as much again in backward,
        plus a reduce-scatter of the same volume).
    """
    if not layout.sharded:
        if out is not None:
            return torch.matmul(left, right.transpose(1, 2), out=out)
        return torch.matmul(left, right.transpose(1, 2))
    if layout.kind == TWO_D:  # tiles [c, N/cp0, N/cp1]: generalised Cannon
        return triangle_product_2d(left, right, layout, out)
    if torch.is_grad_enabled():
        return _GatheredProduct.apply(left, right, layout)
    out = out if out is not None else left.new_empty(left.shape)
    _gathered_product_into(out, left, right, layout)
    return out


# Operand-sized buffers alive during a no-grad 2d product: the caller's left and right, the
# transposed right, the two skewed tiles and the two in flight (the trimul's chunk budget).
CANNON_OPERAND_COPIES = 7


def _cannon_into(out: torch.Tensor, a: torch.Tensor, b_t: torch.Tensor, grid: Grid) -> None:
    """``out[c] = A[c] @ B[c]`` over the grid: ``a, b_t, out: [c, R, C]`` tiles; A's k is its
    column dim, B's k its row dim."""
    walk = RingWalk(grid, a.shape[1] * grid.cp0)

    def step(a_tile, b_tile, pc, *_):
        # the first piece overwrites (beta=0 ignores out's contents, NaN included): no zero fill
        out.baddbmm_(a_tile[:, :, pc.ka], b_tile[:, pc.kb, :], beta=0 if pc is walk.pieces[0] else 1)

    walk.run(a, b_t, step)


class _CannonProduct(torch.autograd.Function):
    """Autograd form of ``_cannon_into``: saves the two local tiles only; backward re-runs the
    walk, each tile's gradient travelling with it and returning home at the end."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b_t: torch.Tensor, grid: Grid) -> torch.Tensor:
        ctx.grid = grid
        ctx.save_for_backward(a, b_t)
        out = a.new_empty(a.shape)
        _cannon_into(out, a, b_t, grid)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        a, b_t = ctx.saved_tensors
        grad = grad_out.contiguous()

        def step(a_tile, b_tile, pc, ga, gb):
            ga[:, :, pc.ka] += torch.matmul(grad, b_tile[:, pc.kb, :].transpose(1, 2))
            gb[:, pc.kb, :] += torch.matmul(a_tile[:, :, pc.ka].transpose(1, 2), grad)

        walk = RingWalk(ctx.grid, a.shape[1] * ctx.grid.cp0)
        grad_a, grad_b = walk.run(a, b_t, step, torch.zeros_like(a), torch.zeros_like(b_t))
        return grad_a, grad_b, None


def triangle_product_2d(left: torch.Tensor, right: torch.Tensor, layout: Layout,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """``x[c, i, j] = sum_k left[c, i, k] · right[c, j, k]`` on the grid.

    Args:
        left, right: ``[c, R, C]`` tiles (rows i resp. j, columns k).
        out: optional ``[c, R, C]`` buffer (no autograd only).
    Returns:
        ``[c, R, C]`` tile of x. ``right`` is grid-transposed (``right^T`` is B of ``x = A·B``),
        then multiplied by the generalised Cannon walk.
    """
    b_t = transpose_tiles(right, layout.grid, dim=1)  # [c, R(k), C(j)]
    if torch.is_grad_enabled() and (left.requires_grad or b_t.requires_grad):
        return _CannonProduct.apply(left, b_t, layout.grid)
    out = out if out is not None else left.new_empty(left.shape)
    _cannon_into(out, left.contiguous(), b_t, layout.grid)
    return out
