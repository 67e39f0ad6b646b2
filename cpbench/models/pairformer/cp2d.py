"""The 2d (grid) implementations of the sharded Pairformer ops (issue 6).

Per rank ``(a, b)`` of the ``cp0 x cp1`` grid (``grid.py``; ``R = N/cp0``, ``C = N/cp1``):
``z: [R, C, c_z]`` (tile ``Z[R_a, C_b]``), ``s: [R, c_s]`` (tokens ``R_a``, replicated over the
grid row: the single representation is sharded along the ``cp0`` axis, like the rows of z, so
that single attention's queries and their pair bias are local). Transitions are pointwise and
need nothing here. The ops dispatch to these functions from their own modules when
``layout.kind == "2d"``.

Traffic per rank (elements; ``P = cp0·cp1``; square grids ``cp0 = cp1 = √P``):

* ``triangle_product_2d``: grid transpose of one operand (``|tile|``) + generalised Cannon
  (``grid.RingWalk``): ``≈ N²·c·(1/cp0 + 1/cp1)``, i.e. ``2·N²·c/√P``; backward twice that
  plus the return of the travelling gradients.
* ``triangle_attention_2d``: streams keys/values (``2·h·d`` channels) along the grid row and
  the grid-transposed bias (``h`` channels) along the grid column with the same walk, merging
  the pieces with an online (log-sum-exp) softmax, once per row chunk (the bias travels once
  per chunk); backward re-runs the walk (key/value and bias gradients travel with their tiles).
* ``attention_pair_bias_2d``: the pair bias never moves; keys/values of the tile's column
  tokens are all-gathered along the grid column (``O(N·c_s)``), and the partial softmaxes of
  the grid row are merged by a log-sum-exp all-reduce (``O(N/cp0·c_s)``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpbench.models.pairformer import chunking, comm
from cpbench.models.pairformer.grid import Grid, RingWalk, transpose_tiles
from cpbench.models.pairformer.grid import agreed_chunk as grid_agreed_chunk
from cpbench.models.pairformer.layout import ONE_D, Layout
from cpbench.models.pairformer.padding import key_bias
from cpbench.models.pairformer.sdpa_lse import sdpa_with_lse


def _axis_layout(grid: Grid, along_row: bool) -> Layout:
    """A 1d layout over the grid row (``along_row``: the cp1 ranks ``(a, *)``) or column (the
    cp0 ranks ``(*, b)``, ``Layout.single_axis``), so that ``comm``'s autograd-aware
    collectives run along one grid axis."""
    if along_row:
        return Layout(ONE_D, grid.row_group, grid.b, grid.cp1)
    return Layout(ONE_D, grid.col_group, grid.a, grid.cp0)


def agreed_chunk(n: int, like: torch.Tensor, layout: Layout) -> int:
    """``grid.agreed_chunk`` over the layout's whole group: the chunk count every rank runs."""
    return grid_agreed_chunk(n, like, layout.group)


# ---------------------------------------------------------------------------------------------
# Triangle multiplication


# Operand-sized buffers alive during a no-grad 2d product: the caller's left and right, the
# transposed right, the two skewed tiles and the two in flight (the trimul's chunk budget).
CANNON_OPERAND_COPIES = 7


def _cannon_into(out: torch.Tensor, a: torch.Tensor, b_t: torch.Tensor, grid: Grid) -> None:
    """``out[c] = A[c] @ B[c]`` over the grid: ``a, b_t, out: [c, R, C]`` tiles; A's k is its
    column dim, B's k its row dim."""
    out.zero_()

    def step(a_tile, b_tile, pc, *_):
        out.baddbmm_(a_tile[:, :, pc.ka], b_tile[:, pc.kb, :])

    RingWalk(grid, a.shape[1] * grid.cp0).run(a, b_t, step)


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


# ---------------------------------------------------------------------------------------------
# Triangle attention


def _tri_bias_tile(mod, z: torch.Tensor) -> torch.Tensor:
    """Local triangle bias ``[R(j), C(k), h]`` from the tile (row-chunked without autograd)."""
    if torch.is_grad_enabled():
        return mod.bias_proj(mod.norm(z))
    n_rows, n_cols, c_z = z.shape
    out = z.new_empty((n_rows, n_cols, mod.heads))
    rc = chunking.rows_per_chunk(n_rows, n_cols * 2 * c_z * z.element_size(), chunking.budget_bytes(z))
    for rs in chunking.slices(n_rows, rc):
        out[rs] = mod.bias_proj(mod.norm(z[rs]))
    return out


def _ring_attention(q: torch.Tensor, kv: torch.Tensor, bias_t: torch.Tensor, key_b: torch.Tensor,
                    walk: RingWalk) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries local, keys/values and bias streamed by the walk, pieces merged by log-sum-exp.

    Args:
        q: ``[r, h, C, d]`` queries of r tile rows; kv: ``[2, r, h, C(k), d]`` their keys/values
        (A-side, along the grid row); bias_t: ``[R(k), C(j), h]`` grid-transposed bias
        (B-side, along the grid column); key_b: ``[N]`` key-mask bias.
    Returns:
        ``o: [r, h, C, d]`` fp32 and ``lse: [r, h, C]`` fp32.
    """
    r = q.shape[0]
    state = {"acc": q.new_zeros(q.shape, dtype=torch.float32),
             "lse": q.new_full(q.shape[:-1], float("-inf"), dtype=torch.float32)}

    def step(kv_tile, b_tile, pc, *_):
        mask = (b_tile[pc.kb].permute(2, 1, 0) + key_b[pc.k]).unsqueeze(0).contiguous()  # [1, h, C, kk]
        o_p, lse_p = sdpa_with_lse(q, kv_tile[0][:, :, pc.ka].contiguous(), kv_tile[1][:, :, pc.ka].contiguous(),
                                   mask.expand(r, -1, -1, -1))
        lse = torch.logaddexp(state["lse"], lse_p)
        state["acc"].mul_(torch.exp(state["lse"] - lse).unsqueeze(-1))
        state["acc"].add_(o_p.float() * torch.exp(lse_p - lse).unsqueeze(-1))
        state["lse"] = lse

    walk.run(kv, bias_t, step)
    return state["acc"], state["lse"]


class _RingAttention(torch.autograd.Function):
    """Autograd form of ``_ring_attention`` over row chunks of the tile: saves the local q,
    k/v, bias tile, output and log-sum-exp only; backward re-runs the walk per row chunk
    (flash-attention style, probabilities recomputed from the saved log-sum-exp), the key/value
    and bias gradients travelling with their tiles and returning home at the end."""

    @staticmethod
    def forward(ctx, q, kv, bias_t, key_b, walk, rc):
        o, lse = torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)
        for rs in chunking.slices(q.shape[0], rc):
            o_r, lse[rs] = _ring_attention(q[rs], kv[:, rs].contiguous(), bias_t, key_b, walk)
            o[rs] = o_r.to(q.dtype)
        ctx.save_for_backward(q, kv, bias_t, o, lse)
        ctx.key_b, ctx.walk, ctx.rc = key_b, walk, rc
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, kv, bias_t, o, lse = ctx.saved_tensors
        key_b, scale = ctx.key_b, q.shape[-1] ** -0.5
        grad_o = grad_o.float()
        delta = (grad_o * o.float()).sum(-1)  # [R, h, C]: rowsum(dO * O) of the softmax backward
        dq = torch.zeros_like(q, dtype=torch.float32)
        dkv = torch.zeros_like(kv)
        dbias = torch.zeros_like(bias_t, dtype=torch.float32)
        for rs in chunking.slices(q.shape[0], ctx.rc):
            q_r, do_r, lse_r, delta_r, dq_r = q[rs].float(), grad_o[rs], lse[rs], delta[rs], dq[rs]

            def step(kv_tile, b_tile, pc, dkv_acc, db_acc):
                k_p, v_p = kv_tile[0][:, :, pc.ka].float(), kv_tile[1][:, :, pc.ka].float()  # [r, h, kk, d]
                bias_p = b_tile[pc.kb].permute(2, 1, 0).float() + key_b[pc.k].float()  # [h, C, kk]
                p = torch.exp(torch.matmul(q_r, k_p.transpose(-1, -2)).mul_(scale).add_(bias_p) - lse_r[..., None])
                ds = p * (torch.matmul(do_r, v_p.transpose(-1, -2)) - delta_r[..., None])  # [r, h, C, kk]
                dkv_acc[1][:, :, pc.ka] += torch.matmul(p.transpose(-1, -2), do_r)
                del p
                dq_r.add_(torch.matmul(ds, k_p), alpha=scale)
                dkv_acc[0][:, :, pc.ka] += torch.matmul(ds.transpose(-1, -2), q_r).mul_(scale)
                db_acc[pc.kb] += ds.sum(0).permute(2, 1, 0)  # the bias is shared by every row i

            kv_r = kv[:, rs].contiguous()
            dkv_r, db_r = ctx.walk.run(kv_r, bias_t, step, torch.zeros_like(kv_r, dtype=torch.float32), dbias.new_zeros(dbias.shape))
            dkv[:, rs] = dkv_r.to(kv.dtype)
            dbias += db_r
        return dq.to(q.dtype), dkv, dbias.to(bias_t.dtype), None, None, None


def triangle_attention_2d(mod, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Triangle attention (starting node on Z; ending node on Z^T) for a grid tile.

    ``mod`` is the ``triatt.TriangleAttention`` whose parameters are used. Per row i of the tile,
    queries are the local j in ``C_b``; keys/values ``z_ik`` for all k travel along the grid row,
    the bias ``b_jk`` (j in ``C_b``) along the grid column after a grid transpose
    (``grid.RingWalk``), merged with an online softmax; work is cut into row chunks (one walk
    each) so the transient buffers fit the chunk budget, in training too.

    Args: ``z: [R, C, c_z]``, ``token_mask: [N]`` bool. Returns ``[R, C, c_z]`` (in place
    without autograd).
    """
    grid = layout.grid
    n_rows, n_cols, c_z = z.shape
    h, d = mod.heads, mod.head_dim
    key_b = key_bias(token_mask, z.dtype)  # [N]
    bias_t = transpose_tiles(_tri_bias_tile(mod, z), grid, dim=0)  # [R(k), C(j), h]
    walk = RingWalk(grid, token_mask.shape[0])
    es = z.element_size()
    if torch.is_grad_enabled():
        # Backward per row: four fp32 [h, C, kk] piece buffers and the travelling fp32 key/value
        # gradients (kk <= N / max(cp0, cp1)).
        kk = token_mask.shape[0] // max(grid.cp0, grid.cp1)
        per_row_b = n_cols * h * (16 * kk + 24 * d)
        rc = agreed_chunk(chunking.rows_per_chunk(n_rows, per_row_b, chunking.budget_bytes(z)), z, layout)
        q, k, v, g = mod.qkvg(mod.norm(z)).view(n_rows, n_cols, 4, h, d).unbind(2)
        kv = torch.stack([k.transpose(1, 2), v.transpose(1, 2)])  # [2, R, h, C(k), d]
        o = _RingAttention.apply(q.transpose(1, 2).contiguous(), kv, bias_t, key_b, walk, rc)
        o = o.transpose(1, 2) * torch.sigmoid(g)  # [R, C, h, d]
        return z + mod.out(o.reshape(n_rows, n_cols, h * d))
    # Per row: normed z, q/k/v/g, two key/value tiles (double buffer) plus the skewed copy, the
    # fp32 accumulator and piece output.
    per_row_b = n_cols * (2 * c_z * es + 12 * h * d * es + 12 * h * d)
    rc = agreed_chunk(chunking.rows_per_chunk(n_rows, per_row_b, chunking.budget_bytes(z)), z, layout)
    for rs in chunking.slices(n_rows, rc):
        r = rs.stop - rs.start
        q, k, v, g = mod.qkvg(mod.norm(z[rs])).view(r, n_cols, 4, h, d).unbind(2)
        kv = torch.stack([k.transpose(1, 2), v.transpose(1, 2)])  # [2, r, h, C(k), d]
        del k, v
        acc, _ = _ring_attention(q.transpose(1, 2).contiguous(), kv, bias_t, key_b, walk)
        del kv
        o = acc.to(z.dtype).transpose(1, 2) * torch.sigmoid(g)  # [r, C, h, d]
        z[rs] += mod.out(o.reshape(r, n_cols, h * d))
    return z


# ---------------------------------------------------------------------------------------------
# Single attention with pair bias


class _SumOverAxis(torch.autograd.Function):
    """All-reduce (sum) along one grid axis; every rank of it uses the sum, so the backward is
    the all-reduce of the gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, axis: Layout) -> torch.Tensor:
        ctx.axis = axis
        return comm.all_reduce_(x.clone(), axis)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return comm.all_reduce_(grad.clone(), ctx.axis), None


def _max_over_axis(x: torch.Tensor, axis: Layout) -> torch.Tensor:
    if axis.sharded:
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=axis.group)
        comm.BYTES.add(2 * (axis.size - 1) * x.numel() * x.element_size() / axis.size)
    return x


def attention_pair_bias_2d(mod, s: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor,
                           layout: Layout) -> torch.Tensor:
    """Single attention with pair bias on the grid (``mod``: ``single_att.AttentionPairBias``).

    Rank ``(a, b)`` attends its queries ``R_a`` over its keys ``C_b`` with its local bias tile,
    then the grid row merges the ``cp1`` partial softmaxes (log-sum-exp weights, one all-reduce).

    Args: ``s: [R, c_s]`` (tokens ``R_a``), ``z: [R, C, c_z]``, ``token_mask: [N]``.
    Returns: ``[R, c_s]``, identical on the ranks of the grid row.
    """
    grid = layout.grid
    n_rows, c_s = s.shape
    h, d = mod.heads, c_s // mod.heads
    cols = grid.cols(token_mask.shape[0])
    row = _axis_layout(grid, along_row=True)
    a = mod.norm_s(s)
    q = mod.q(a).view(n_rows, h, d).transpose(0, 1)  # [h, R, d]
    k, v, g = mod.kvg(a).chunk(3, dim=-1)
    kv = comm.all_gather_rows(torch.cat([k, v], dim=-1).contiguous(), _axis_layout(grid, along_row=False))[cols]
    k_c, v_c = (t.reshape(-1, h, d).transpose(0, 1) for t in kv.chunk(2, dim=-1))  # [h, C, d]
    bias = mod._pair_bias(z).permute(2, 0, 1) + key_bias(token_mask[cols], z.dtype)  # [h, R, C]
    logits = torch.baddbmm(bias.to(s.dtype), q, k_c.transpose(1, 2), alpha=d ** -0.5).float()
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [h, R, 1]
    o_p = torch.matmul(torch.exp(logits - lse), v_c.float())  # [h, R, d]
    del logits
    lse_max = _max_over_axis(lse.detach().clone(), row)  # any per-query constant: cancels below
    w = torch.exp(lse - lse_max)
    num_den = torch.cat([o_p * w, w], dim=-1)  # [h, R, d + 1]
    if row.sharded:
        num_den = _SumOverAxis.apply(num_den, row)
    o = (num_den[..., :d] / num_den[..., d:]).to(s.dtype)
    o = o.transpose(0, 1).reshape(n_rows, c_s) * torch.sigmoid(g)
    return s + mod.out(o)
