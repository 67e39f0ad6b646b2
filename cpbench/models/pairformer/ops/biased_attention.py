"""Attention of many query rows sharing one additive bias: the kernel of triangle attention.

Triangle attention attends every row of the pair tensor with the same ``[heads, N, N]`` bias
(plus the key mask, folded into it). The backends (``kernels.py``):

* ``torch``: ``F.scaled_dot_product_attention`` with the bias expanded over the rows (cuDNN or
  the memory-efficient kernel on CUDA, the math kernel on a CPU).
* ``flex``: ``flex_attention`` reading the bias in ``score_mod``; compiled on CUDA, where its
  backward gives gradients into q, k, v and the bias (``model.compile_training=true``, the
  default; with ``false`` the ``torch`` kernel runs under autograd); eager on a CPU (forward
  only: with autograd the ``torch`` kernel runs).
* ``model.attention=triton`` (inference under ``flex``, on CUDA or in Triton's interpreter): the
  Triton kernel of ``ops/triton_attention.py``, which shares each bias tile between two rows; its
  output is a ``[rows, heads, Lq, d]`` view of a ``[rows, Lq, heads, d]`` tensor.
* ``cueq``: ``cuequivariance_torch.triangle_attention`` (its ``(N, H, Q, D)`` layout with B = 1 is
  ours: rows, heads, queries, head dim; it casts the bias to fp32). Its log-sum-exp is "for
  special use only", so ``biased_attention_lse`` (the 2d ring) runs the ``torch`` kernel there.

Shapes: ``q, k, v: [rows, heads, Lq | Lk, d]``, ``bias: [heads, Lq, Lk]``; outputs ``o: [rows,
heads, Lq, d]`` and, from ``biased_attention_lse`` (no autograd), ``lse: [rows, heads, Lq]`` fp32
(natural log), for the 2d ring's online softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from cpbench.models.pairformer.ops import kernels
from cpbench.models.pairformer.ops.sdpa_lse import sdpa_with_lse

try:  # torch >= 2.9 asks for the log-sum-exp through an AuxRequest; earlier: return_lse=True
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # pragma: no cover - depends on the torch version
    AuxRequest = None


def _ta():
    """``ops/triton_attention.py``, imported at its first use (it imports Triton)."""
    from cpbench.models.pairformer.ops import triton_attention

    return triton_attention


def _on_triton(q: torch.Tensor) -> bool:
    """Whether ``q``'s attention runs the Triton kernel (``model.attention=triton``, a shape it takes)."""
    return kernels.triton_attention(q) and _ta().usable(q)


@kernels.compiled
def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx, kv_idx]

    return flex_attention(q, k, v, score_mod=score_mod)


@kernels.compiled
def _flex_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor):
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx, kv_idx]

    if AuxRequest is not None:
        o, aux = flex_attention(q, k, v, score_mod=score_mod, return_aux=AuxRequest(lse=True))
        return o, aux.lse
    return flex_attention(q, k, v, score_mod=score_mod, return_lse=True)


def biased_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``softmax(q kᵀ/√d + bias) v`` for every row; autograd-aware under ``torch`` (and ``flex``
    on CUDA). Args and returns: see the module docstring."""
    if _on_triton(q):
        return _ta().attention(q, k, v, bias)
    if kernels.compiling(q) or (kernels.active() == "flex" and not torch.is_grad_enabled()):
        return _flex(q, k, v, bias)  # compiled on CUDA; eager on a CPU (forward only)
    if kernels.active() == "cueq":
        import cuequivariance_torch  # present: kernels.resolve checked it

        return cuequivariance_torch.triangle_attention(q, k, v, bias.unsqueeze(0))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(0).expand(q.shape[0], -1, -1, -1))


def biased_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` of ``biased_attention`` without autograd; ``lse`` fp32 ``[rows, heads, Lq]``.
    The inputs are detached: the 2d ring calls this inside an autograd function's forward, where
    they still say ``requires_grad``, which eager FlexAttention refuses on a CPU."""
    q, k, v, bias = (t.detach() for t in (q, k, v, bias))
    if _on_triton(q):
        return _ta().attention(q, k, v, bias, with_lse=True)
    if kernels.compiling(q) or (kernels.active() == "flex" and not q.is_cuda):
        o, lse = _flex_lse(q, k, v, bias)
        return o, lse.float()
    return sdpa_with_lse(q, k, v, bias.unsqueeze(0).expand(q.shape[0], -1, -1, -1))
