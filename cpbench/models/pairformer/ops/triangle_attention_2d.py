"""Triangle attention on the 2d grid: queries local, keys/values and the bias streamed around
the ring, pieces merged with an online (log-sum-exp) softmax.

Per rank ``(a, b)`` (``R = N/cp0``, ``C = N/cp1``): ``z: [R, C, c_z]``. Keys/values (``2·h·d``
channels) stream along the grid row and the grid-transposed bias (``h`` channels) along the
grid column with the same walk (``parallel/ring.py``), once per row chunk (the bias travels once
per chunk); backward re-runs the walk (key/value and bias gradients travel with their tiles).
"""

from __future__ import annotations

import torch

from cpbench.models.pairformer.ops.biased_attention import biased_attention_lse
from cpbench.models.pairformer.ops.fused import gated_output
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import Layout
from cpbench.models.pairformer.parallel.padding import key_bias
from cpbench.models.pairformer.parallel.ring import RingWalk
from cpbench.models.pairformer.parallel.transpose import transpose_tiles


def _tri_bias_tile(mod, z: torch.Tensor) -> torch.Tensor:
    """Local triangle bias ``[R(j), C(k), h]`` from the tile (row-chunked without autograd)."""
    if torch.is_grad_enabled():
        return mod._norm_linear(z, mod.bias_proj)
    n_rows, n_cols, c_z = z.shape
    out = z.new_empty((n_rows, n_cols, mod.heads))
    rc = chunking.rows_per_chunk(n_rows, n_cols * 2 * c_z * z.element_size(), chunking.budget_bytes(z))
    for rs in chunking.slices(n_rows, rc):
        out[rs] = mod._norm_linear(z[rs], mod.bias_proj)
    return out


def _ring_attention(q: torch.Tensor, kv: torch.Tensor, bias_t: torch.Tensor, key_b: torch.Tensor,
                    walk: RingWalk) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries local, keys/values and bias streamed by the walk, pieces merged by log-sum-exp.

    Args:
        q: ``[r, h, C, d]`` queries of r tile rows; kv: ``[2, r, h, C(k), d]`` their keys/values
        (A-side, along the grid row); bias_t: ``[R(k), C(j), h]`` grid-transposed bias
        (B-side, along the grid column); key_b: ``[N]`` key-mask bias.
    Returns:
        ``o: [r, h, C, d]`` fp32, stored token-major (``o.transpose(1, 2)`` is a contiguous
        ``[r, C, h, d]``: the gated output's layout, no copy), and ``lse: [r, h, C]`` fp32.
    """
    r, h, c, d = q.shape
    acc = q.new_empty((r, c, h, d), dtype=torch.float32).transpose(1, 2)  # [r, h, C, d]
    state: dict = {"lse": None}

    def step(kv_tile, b_tile, pc, *_):
        bias = (b_tile[pc.kb].permute(2, 1, 0) + key_b[pc.k]).contiguous()  # [h, C, kk]
        o_p, lse_p = biased_attention_lse(q, kv_tile[0][:, :, pc.ka].contiguous(),
                                          kv_tile[1][:, :, pc.ka].contiguous(), bias)
        if state["lse"] is None:  # the first piece is the running result as it is
            acc.copy_(o_p)
            state["lse"] = lse_p
            return
        # online softmax: rescale what is there, add the piece in place (no fp32 temporaries)
        lse = torch.logaddexp(state["lse"], lse_p)
        acc.mul_(torch.exp(state["lse"] - lse).unsqueeze(-1))
        acc.addcmul_(o_p, torch.exp(lse_p - lse).unsqueeze(-1))
        state["lse"] = lse

    walk.run(kv, bias_t, step)
    return acc, state["lse"]


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
            dkv_r, db_r = ctx.walk.run(kv_r, bias_t, step, torch.zeros_like(kv_r, dtype=torch.float32),
                                       dbias.new_zeros(dbias.shape))
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
        rc = comm.agree_min(chunking.rows_per_chunk(n_rows, per_row_b, chunking.budget_bytes(z)), layout, z)
        q, k, v, g = mod._norm_linear(z, mod.qkvg).view(n_rows, n_cols, 4, h, d).unbind(2)
        kv = torch.stack([k.transpose(1, 2), v.transpose(1, 2)])  # [2, R, h, C(k), d]
        o = _RingAttention.apply(q.transpose(1, 2).contiguous(), kv, bias_t, key_b, walk, rc)
        return gated_output(o.transpose(1, 2).reshape(n_rows, n_cols, h * d), g.reshape(n_rows, n_cols, h * d),
                            mod.out.weight, z)  # z plus the update, a new tensor
    # Per row: normed z, q/k/v/g, two key/value tiles (double buffer) plus the skewed copy, the
    # fp32 accumulator and piece output.
    per_row_b = n_cols * (2 * c_z * es + 12 * h * d * es + 12 * h * d)
    rc = comm.agree_min(chunking.rows_per_chunk(n_rows, per_row_b, chunking.budget_bytes(z)), layout, z)
    for rs in chunking.slices(n_rows, rc):
        r = rs.stop - rs.start
        q, k, v, g = mod._norm_linear(z[rs], mod.qkvg).view(r, n_cols, 4, h, d).unbind(2)
        kv = torch.stack([k.transpose(1, 2), v.transpose(1, 2)])  # [2, r, h, C(k), d]
        del k, v
        acc, _ = _ring_attention(q.transpose(1, 2).contiguous(), kv, bias_t, key_b, walk)
        del kv
        o = acc.to(z.dtype).transpose(1, 2).reshape(r, n_cols, h * d)  # [r, C, h·d]
        gated_output(o, g.reshape(r, n_cols, h * d), mod.out.weight, z[rs])  # z[rs] += W_out(o * sigmoid(g))
    return z
