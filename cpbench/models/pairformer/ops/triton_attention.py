"""A Triton kernel for triangle attention's shape: many rows attending with one shared bias
(the ``triton`` choice of ``model.attention``; inference).

Triangle attention runs ``rows × heads`` attentions of ``N`` queries and ``N`` keys of head dim 32,
all adding the same ``[heads, N, N]`` bias. FlexAttention reads the bias in ``score_mod``: every
program of a row loads its ``[BLOCK_M, BLOCK_N]`` tile of the bias for every key block, so at
N=2,048 (cp=1) one op loads ``rows · heads · N² · 2`` bytes = 69 GB of bias (bf16), against 34 GB of
keys and values (128-query blocks) and 4.4 TFLOP of matmuls; on one H200 its kernel took 19.4 ms
per op (214 TFLOP/s; ``docs/perf_notes.md``). Whether those loads (the L2 cache may serve many) are what bounds
it is not measured; ``scripts/flex_microbench.py --cases triton`` times this kernel beside flex.

Here one program owns ``BLOCK_M`` queries of one head for ``ROWS`` rows (1 or 2): for each key
block it loads the bias tile once and uses it for both rows, each with its own 2D ``tl.dot``s
(Hopper's wgmma where ``BLOCK_M`` is 64 or more) and online softmax. Two rows per program halve the
bias traffic; on one H100 that did not make the kernel faster (188 against 194 TFLOP/s,
2026-12-05), so the loads are not what bounds it. What each score costs besides the matmuls is:
FlexAttention scales the dot, converts and adds the bias, scales to base 2, then takes the max,
subtracts, takes ``exp2``, sums and converts, about nine instructions per score beside one of the
special-function unit, whose throughput alone (16 per clock and SM) takes about 8 ms of an op at
N=2,048 (arithmetic). So this kernel scales ``q`` by ``1/√D`` once as it loads it and hands the
bias tile to the first dot as its accumulator (the tensor cores add it); the exponent
``s·log2(e) - m·log2(e)`` is one fused multiply-add; blocks that divide ``Lq`` and ``Lk`` load and
score without masks. Compiled for sm_90 (Triton 3.6.0, ``scripts/triton_resources.py``'s
compiler), the key loop of the default setting has 329 instructions per thread against 459 before
(2026-12-06). On one H100 it was no faster: 192 TFLOP/s at best against flex's 215
(``docs/benchmarks/2026-12-06-h100-tattn/``), so the kernel is not bound by the instructions it
issues, and ``model.attention=auto`` stays on flex. Loading each step's bias tile a step ahead,
which Triton then loads straight into the accumulator's layout in narrower loads, was slower in
every setting there (54-135 TFLOP/s). (Also tried, on the CPU's compiler:
``ex2.approx.ftz.bf16x2``, two exponentials per instruction, which ptxas lowers for sm_90 to one
``MUFU.EX2.BF16`` per score and more unpacking, 373 instructions. A batched 3D ``tl.dot`` over
more rows was tried first: compiled for sm_90 it ran on ``mma.sync`` and spilled registers at
64-query blocks and up.) Nsight Compute on one H100 (2026-12-06,
``docs/benchmarks/2026-12-06-h100-tattn2/``) says why: flex's kernel fills 76.6 % of the issue
slots, this one 56 %, its warps waiting on the bias tile's global loads (the accumulator is loaded
into registers, which Triton's pipeliner does not stage ahead); neither is bound by the
special-function unit (44-50 %) or the tensor cores (21-23 %). Three variants tried there, each
slower in every setting than this kernel: the next key block's dot issued before this block's
softmax (its wgmma then overlaps the exponentials, but the second score tile costs registers), the
bias added as ``eye·bias`` (a matmul operand, staged through shared memory: no global load left in
the loop), and every second key block's exponentials by a cubic on the FMA pipes. The output is written
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
    def _online_step(q, kt, v, bias, n_ok, m_i, l_i, acc, EVEN_N: tl.constexpr, PREC: tl.constexpr):
        """One key block of one row's online softmax, in natural-log units: ``q [BLOCK_M, D]`` (already
        scaled by ``1/√D``), ``kt [D, BLOCK_N]``, ``v [BLOCK_N, D]``, ``bias [BLOCK_M, BLOCK_N]`` fp32
        (the dot's accumulator: the tensor cores add it). ``exp2`` takes ``s·log2(e) - m·log2(e)``, one
        fused multiply-add per score. Returns the new ``(m, l, acc)``."""
        LOG2E: tl.constexpr = 1.4426950408889634
        s = tl.dot(q, kt, bias, input_precision=PREC)
        if not EVEN_N:
            s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_log2 = m_new * LOG2E
        alpha = tl.exp2(m_i * LOG2E - m_log2)
        p = tl.exp2(s * LOG2E - m_log2[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        return m_new, l_i, acc

    @triton.jit
    def _finish(o_ptr, o_off, lse_ptr, l_off, ok, m_i, l_i, acc, HAS_LSE: tl.constexpr):
        """Store one row's output tile (and its log-sum-exp, natural log)."""
        tl.store(o_ptr + o_off, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=ok[:, None])
        if HAS_LSE:
            tl.store(lse_ptr + l_off, m_i + tl.log(l_i), mask=ok)

    @triton.jit
    def _bias_tile(b_rows, n, b2, m_ok, n_ok, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr):
        """The ``[BLOCK_M, BLOCK_N]`` bias tile of keys ``n`` (``b_rows``: its rows' pointers)."""
        if EVEN_M and EVEN_N:
            return tl.load(b_rows + n[None, :] * b2)
        else:
            return tl.load(b_rows + n[None, :] * b2, mask=m_ok[:, None] & n_ok[None, :], other=0.0)

    @triton.jit
    def _attention_kernel(q_ptr, q0, q1, q2, q3, k_ptr, k0, k1, k2, k3, v_ptr, v0, v1, v2, v3,
                          b_ptr, b0, b1, b2, o_ptr, o0, o1, o2, o3, lse_ptr, l0, l1, l2,
                          n_rows, Lq, Lk, sm_scale,
                          D: tl.constexpr, ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, HAS_LSE: tl.constexpr,
                          PREC: tl.constexpr):
        """Queries ``[pid0·BLOCK_M, +BLOCK_M)`` of head ``pid1`` for rows ``pid2·ROWS + (0, 1)``
        (``ROWS`` 1 or 2: one bias tile per key block serves both rows' dots).

        ``q`` is scaled by ``1/√D`` once, as it is loaded (rounded to its own dtype), so the scores
        are ``q·k + bias`` with the bias as the dot's accumulator. ``EVEN_M`` / ``EVEN_N``: ``Lq`` /
        ``Lk`` are multiples of the blocks, so no load or score is masked. 64-bit offsets only in
        the program's scalar bases; within a tile 32-bit (queries < BLOCK_M, keys < Lk, channels <
        D: each term far below 2**31 elements)."""
        h = tl.program_id(1).to(tl.int64)
        r0 = tl.program_id(2).to(tl.int64) * ROWS
        m0 = tl.program_id(0).to(tl.int64) * BLOCK_M
        ml, d, nl = tl.arange(0, BLOCK_M), tl.arange(0, D), tl.arange(0, BLOCK_N)
        m_ok = (m0 + ml < Lq) | EVEN_M
        two = (ROWS == 2) & (r0 + 1 < n_rows)  # the program's second row exists
        q_off = ml[:, None] * q2 + d[None, :] * q3
        q_dtype = q_ptr.dtype.element_ty
        qa = tl.load(q_ptr + (r0 * q0 + h * q1 + m0 * q2) + q_off, mask=m_ok[:, None], other=0.0)
        qa = (qa.to(tl.float32) * sm_scale).to(q_dtype)
        k_base = k_ptr + (r0 * k0 + h * k1)
        v_base = v_ptr + (r0 * v0 + h * v1)
        b_base = b_ptr + (h * b0 + m0 * b1)
        m_a = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_a = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc_a = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        if ROWS == 2:
            qb = tl.load(q_ptr + ((r0 + 1) * q0 + h * q1 + m0 * q2) + q_off, mask=m_ok[:, None] & two, other=0.0)
            qb = (qb.to(tl.float32) * sm_scale).to(q_dtype)
            m_b = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
            l_b = tl.zeros((BLOCK_M,), dtype=tl.float32)
            acc_b = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        b_rows = b_base + ml[:, None] * b1
        for n0 in range(0, Lk, BLOCK_N):
            n = n0 + nl
            n_ok = (n < Lk) | EVEN_N
            kt_off = n[None, :] * k2 + d[:, None] * k3  # [D, BLOCK_N]
            v_off = n[:, None] * v2 + d[None, :] * v3   # [BLOCK_N, D]
            bias = _bias_tile(b_rows, n, b2, m_ok, n_ok, EVEN_M, EVEN_N).to(tl.float32)  # [BLOCK_M, BLOCK_N]
            if EVEN_N:
                kt = tl.load(k_base + kt_off)
                v = tl.load(v_base + v_off)
            else:
                kt = tl.load(k_base + kt_off, mask=n_ok[None, :], other=0.0)
                v = tl.load(v_base + v_off, mask=n_ok[:, None], other=0.0)
            m_a, l_a, acc_a = _online_step(qa, kt, v, bias, n_ok, m_a, l_a, acc_a, EVEN_N, PREC)
            if ROWS == 2:
                kt = tl.load(k_base + k0 + kt_off, mask=n_ok[None, :] & two, other=0.0)
                v = tl.load(v_base + v0 + v_off, mask=n_ok[:, None] & two, other=0.0)
                m_b, l_b, acc_b = _online_step(qb, kt, v, bias, n_ok, m_b, l_b, acc_b, EVEN_N, PREC)
        o_off = ml[:, None] * o2 + d[None, :] * o3
        l_off = ml * l2
        _finish(o_ptr + (r0 * o0 + h * o1 + m0 * o2), o_off, lse_ptr + (r0 * l0 + h * l1 + m0 * l2), l_off, m_ok,
                m_a, l_a, acc_a, HAS_LSE)
        if ROWS == 2:
            _finish(o_ptr + ((r0 + 1) * o0 + h * o1 + m0 * o2), o_off, lse_ptr + ((r0 + 1) * l0 + h * l1 + m0 * l2),
                    l_off, m_ok & two, m_b, l_b, acc_b, HAS_LSE)


# Launch settings in half precision: ROWS rows share each bias tile; BLOCK_M queries and BLOCK_N
# keys per step. Measured on one H100 at N=2,048, 256 rows (scripts/flex_microbench.py --cases
# triton, 2026-12-05: docs/benchmarks/2026-12-05-h100-triton/tattn.json): 194 TFLOP/s, against
# 204 for flex; two rows per program reached 188 at best, the earlier CPU-chosen two-row setting 113.
TILES = dict(ROWS=1, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
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
    if launch["ROWS"] not in (1, 2):
        raise ValueError(f"ROWS={launch['ROWS']}: the kernel shares a bias tile between 1 or 2 rows")
    grid = (triton.cdiv(lq, launch["BLOCK_M"]), heads, triton.cdiv(rows, launch["ROWS"]))
    _attention_kernel[grid](
        q, *q.stride(), k, *k.stride(), v, *v.stride(), bias, *bias.stride(), o, *o.stride(),
        lse, *(lse.stride() if with_lse else (0, 0, 0)),
        rows, lq, lk, 1.0 / math.sqrt(d), D=d, HAS_LSE=with_lse,
        EVEN_M=lq % launch["BLOCK_M"] == 0, EVEN_N=lk % launch["BLOCK_N"] == 0,
        PREC="ieee" if q.dtype == torch.float32 else "tf32", **launch)
    return (o, lse) if with_lse else o
