"""Fused attention that also returns each query's log-sum-exp, for merging attention pieces.

The 2d ops and the sampler's 2d token attention compute attention over key pieces and merge
the pieces with their log-sum-exp (online softmax), so they need a kernel that returns it.

* CPU: PyTorch's flash-attention kernel for the CPU.
* CUDA: cuDNN's attention where it runs and agrees, else the memory-efficient kernel. The
  memory-efficient kernel was 2.85× slower than cuDNN on the triangle attention's shape (head
  dim 32, an arbitrary bias; docs/perf_notes.md). cuDNN's op returns the log-sum-exp too, but
  its support depends on the cuDNN version, the dtype and the shapes. So the first call in a
  process runs both kernels on a few query rows. cuDNN is used only if it ran and its output
  and log-sum-exp agree with the memory-efficient kernel's; any later failure switches back
  for good. ``kernel_in_use()`` says which kernel runs (None before the first CUDA call).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

log = logging.getLogger("cpbench")

_CUDA_BIAS_ALIGN = 16
_CHECK_ROWS = 16            # query rows of the first call that both kernels run
_LSE_ATOL = 1e-2            # natural-log units; a base-2 or unscaled log-sum-exp is far off
_OUT_RTOL = 5e-2            # of the output's largest magnitude (bf16 inputs)

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
_cuda_kernel: str | None = None  # "cudnn" or "efficient", decided on the first CUDA call


def _aligned(bias: torch.Tensor) -> torch.Tensor:
    """The bias with 16-element aligned rows, as the fused CUDA kernels need (F.sdpa pads the
    same way); piece widths are multiples of N/lcm(cp0, cp1), not always of 16."""
    if bias.stride(-2) % _CUDA_BIAS_ALIGN == 0:
        return bias
    shape, k_len = bias.shape, bias.shape[-1]
    base = bias[:1] if bias.stride(0) == 0 else bias  # keep a batch-expanded bias expanded
    aligned = base.new_empty((*base.shape[:-1], -(-k_len // _CUDA_BIAS_ALIGN) * _CUDA_BIAS_ALIGN))
    return aligned[..., :k_len].copy_(base).expand(shape)


def lse_rows(lse: torch.Tensor, n_queries: int) -> torch.Tensor:
    """A kernel's log-sum-exp as ``[B, h, Lq]``: the memory-efficient kernel pads the query
    length (``[B, h, Lq_pad]``), cuDNN may add a trailing unit dimension (``[B, h, Lq, 1]``)."""
    return lse.reshape(*lse.shape[:2], -1)[..., :n_queries]


def _efficient(q, k, v, bias):
    o, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True)
    return o, lse_rows(lse, q.shape[2])


def _cudnn(q, k, v, bias):
    o, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True)[:2]
    return o, lse_rows(lse, q.shape[2])


def first_agreeing(candidates: list[tuple[str, Kernel]], reference: Kernel, q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, bias: torch.Tensor) -> str | None:
    """The name of the first candidate that runs on the first ``_CHECK_ROWS`` query rows and
    agrees with ``reference`` there (output and log-sum-exp); None when none does."""
    rows = slice(0, min(_CHECK_ROWS, q.shape[2]))
    q_c, bias_c = q[:, :, rows].contiguous(), bias[:, :, rows]
    o_ref, lse_ref = reference(q_c, k, v, bias_c)
    for name, kernel in candidates:
        try:
            o, lse = kernel(q_c, k, v, bias_c)
        except RuntimeError as exc:
            log.info("attention with log-sum-exp: %s kernel unavailable (%s)", name, str(exc).splitlines()[0][:160])
            continue
        scale = float(o_ref.float().abs().max()) or 1.0
        out_err = float((o.float() - o_ref.float()).abs().max()) / scale
        lse_err = float((lse.float() - lse_ref.float()).abs().max())
        if o.shape == o_ref.shape and lse.shape == lse_ref.shape and out_err <= _OUT_RTOL and lse_err <= _LSE_ATOL:
            return name
        log.info("attention with log-sum-exp: %s kernel disagrees (output %.3g, log-sum-exp %.3g)", name,
                 out_err, lse_err)
    return None


def kernel_in_use() -> str | None:
    """The CUDA kernel ``sdpa_with_lse`` uses in this process (None before its first CUDA call)."""
    return _cuda_kernel


def sdpa_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused attention that also returns the log-sum-exp of each query's logits (no autograd).

    Args: ``q: [B, h, Lq, d]``, ``k, v: [B, h, Lk, d]``, ``bias: [B, h, Lq, Lk]`` (may be expanded).
    Returns: ``o: [B, h, Lq, d]``, ``lse: [B, h, Lq]`` fp32.
    """
    global _cuda_kernel
    if not q.is_cuda:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)
    bias = _aligned(bias)
    if _cuda_kernel is None:
        _cuda_kernel = first_agreeing([("cudnn", _cudnn)], _efficient, q, k, v, bias) or "efficient"
        log.info("attention with log-sum-exp: %s kernel", _cuda_kernel)
    if _cuda_kernel == "cudnn":
        try:
            return _cudnn(q, k, v, bias)
        except RuntimeError as exc:
            _cuda_kernel = "efficient"
            log.info("attention with log-sum-exp: cuDNN failed (%s); memory-efficient kernel from now on",
                     str(exc).splitlines()[0][:160])
    return _efficient(q, k, v, bias)
