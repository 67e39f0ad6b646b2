"""A Triton kernel for triangle attention's shape: many rows attending with one shared bias
(the ``triton`` choice of ``model.attention``; inference).

Triangle attention runs ``rows × heads`` attentions of ``N`` queries and ``N`` keys of head dim 32,
all adding the same ``[heads, N, N]`` bias. FlexAttention reads the bias in ``score_mod``: every
program of a row loads its ``[BLOCK_M, BLOCK_N]`` tile of the bias for every key block, so at
N=2,048 (cp=1) one op loads ``rows · heads · N² · 2`` bytes = 69 GB of bias (bf16), against 34 GB of
keys and values (128-query blocks) and 4.4 TFLOP of matmuls; on one H200 its kernel took 19.4 ms
per op (214 TFLOP/s; ``docs/perf_notes.md``). Whether those loads (the L2 cache may serve many) are what bounds
it is not measured; ``scripts/flex_microbench.py --cases triton`` times this kernel beside flex.

Here one program owns ``BLOCK_M`` queries of one head for ``ROWS`` rows: for each key block it
loads the bias tile once and uses it for all ``ROWS`` rows (a batched ``tl.dot`` over
``[ROWS, BLOCK_M, D]`` queries against ``[ROWS, D, BLOCK_N]`` keys), with an online softmax per
row (exp2, the scale folded in). The bias traffic falls ``ROWS``-fold. The output is written
through its strides, so the caller can take it in the ``[rows, N, heads · D]`` layout of the gated
output without a transposing copy (``attention``'s result is a ``[rows, heads, N, D]`` view of
that), and the kernel can return each query's log-sum-exp (natural log, fp32) for the 2d ring.

Forward only: training keeps FlexAttention (its fused backward). Shapes per rank: ``q, k, v:
[rows, heads, L, D]`` (any strides: the projection's views), ``bias: [heads, Lq, Lk]``; ``D`` a
power of two from 16 to 128. ``TRITON_INTERPRET=1`` runs it on a CPU (the parity tests,
``tests/unit/test_triton_attention.py``, against SDPA with the bias expanded).
"""

from __future__ import annotations

import math

import torch

from cpbench.models.pairformer.ops.triton_passes import HAS_TRITON, interpreted

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _attention_kernel(q_ptr, q0, q1, q2, q3, k_ptr, k0, k1, k2, k3, v_ptr, v0, v1, v2, v3,
                          b_ptr, b0, b1, b2, o_ptr, o0, o1, o2, o3, lse_ptr, l0, l1, l2,
                          n_rows, Lq, Lk, qk_scale,
                          D: tl.constexpr, ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          HAS_LSE: tl.constexpr, PREC: tl.constexpr):
        """Queries ``[pid0·BLOCK_M, +BLOCK_M)`` of head ``pid1`` for rows ``[pid2·ROWS, +ROWS)``.

        Scores in base 2: ``s = (q·k) · scale·log2(e) + bias · log2(e)``, so ``exp2`` gives the
        natural softmax; the log-sum-exp is converted back to natural log at the end."""
        LOG2E: tl.constexpr = 1.4426950408889634
        h = tl.program_id(1).to(tl.int64)
        r = tl.program_id(2).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
        m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        d = tl.arange(0, D).to(tl.int64)
        r_ok, m_ok = r < n_rows, m < Lq
        rq = r[:, None, None]
        q = tl.load(q_ptr + rq * q0 + h * q1 + m[None, :, None] * q2 + d[None, None, :] * q3,
                    mask=r_ok[:, None, None] & m_ok[None, :, None], other=0.0)             # [ROWS, BLOCK_M, D]
        m_i = tl.full((ROWS, BLOCK_M), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((ROWS, BLOCK_M), dtype=tl.float32)
        acc = tl.zeros((ROWS, BLOCK_M, D), dtype=tl.float32)
        for n0 in range(0, Lk, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N).to(tl.int64)
            n_ok = n < Lk
            bias = tl.load(b_ptr + h * b0 + m[:, None] * b1 + n[None, :] * b2,
                           mask=m_ok[:, None] & n_ok[None, :], other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_N]
            kv_ok = r_ok[:, None, None] & n_ok[None, None, :]
            kt = tl.load(k_ptr + rq * k0 + h * k1 + n[None, None, :] * k2 + d[None, :, None] * k3,
                         mask=kv_ok, other=0.0)                                             # [ROWS, D, BLOCK_N]
            s = tl.dot(q, kt, input_precision=PREC) * qk_scale + (bias * LOG2E)[None, :, :]
            s = tl.where(n_ok[None, None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=2))
            p = tl.exp2(s - m_new[:, :, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=2)
            v = tl.load(v_ptr + rq * v0 + h * v1 + n[None, :, None] * v2 + d[None, None, :] * v3,
                        mask=r_ok[:, None, None] & n_ok[None, :, None], other=0.0)         # [ROWS, BLOCK_N, D]
            acc = acc * alpha[:, :, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m_i = m_new
        ok = r_ok[:, None, None] & m_ok[None, :, None]
        tl.store(o_ptr + rq * o0 + h * o1 + m[None, :, None] * o2 + d[None, None, :] * o3,
                 (acc / l_i[:, :, None]).to(o_ptr.dtype.element_ty), mask=ok)
        if HAS_LSE:
            tl.store(lse_ptr + r[:, None] * l0 + h * l1 + m[None, :] * l2, (m_i + tl.log2(l_i)) / LOG2E,
                     mask=r_ok[:, None] & m_ok[None, :])


# Launch settings in half precision: ROWS rows share each bias tile; BLOCK_M queries and
# BLOCK_N keys per step. Untuned: chosen on a CPU, in Triton's interpreter (2026-12-05);
# scripts/flex_microbench.py --cases triton measures the alternatives on a GPU.
TILES = dict(ROWS=2, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
# fp32 (the parity reference): smaller tiles, one stage (shared memory)
FP32_TILES = dict(ROWS=2, BLOCK_M=32, BLOCK_N=32, num_stages=1)


def usable(q: torch.Tensor) -> bool:
    """Whether the kernel runs for ``q: [rows, heads, L, D]``: Triton present, CUDA (or the
    interpreter), ``D`` a power of two from 16 to 128, fp32/bf16/fp16."""
    d = q.shape[-1]
    return (HAS_TRITON and (q.is_cuda or interpreted()) and q.dim() == 4 and 16 <= d <= 128
            and d & (d - 1) == 0 and q.dtype in (torch.float32, torch.bfloat16, torch.float16))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, with_lse: bool = False,
              tiles: dict | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q kᵀ/√D + bias) v`` per row and head, without autograd.

    Args: ``q: [rows, heads, Lq, D]``, ``k, v: [rows, heads, Lk, D]``, ``bias: [heads, Lq, Lk]``
    (any strides); ``tiles`` overrides ``TILES`` (the tuning script). Returns ``o: [rows, heads,
    Lq, D]`` (a view of a ``[rows, Lq, heads, D]`` tensor), with ``with_lse`` also ``lse: [rows,
    heads, Lq]`` fp32 (natural log).
    """
    rows, heads, lq, d = q.shape
    lk = k.shape[2]
    bias = bias.to(q.dtype)  # before its strides are read: a conversion copies
    o = q.new_empty((rows, lq, heads, d)).transpose(1, 2)
    lse = q.new_empty((rows, heads, lq), dtype=torch.float32) if with_lse else o
    launch = {**TILES, **(FP32_TILES if q.dtype == torch.float32 else {}), **(tiles or {})}
    grid = (triton.cdiv(lq, launch["BLOCK_M"]), heads, triton.cdiv(rows, launch["ROWS"]))
    _attention_kernel[grid](
        q, *q.stride(), k, *k.stride(), v, *v.stride(), bias, *bias.stride(), o, *o.stride(),
        lse, *(lse.stride() if with_lse else (0, 0, 0)),
        rows, lq, lk, 1.4426950408889634 / math.sqrt(d), D=d, HAS_LSE=with_lse,
        PREC="ieee" if q.dtype == torch.float32 else "tf32", **launch)
    return (o, lse) if with_lse else o
