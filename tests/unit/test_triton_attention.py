"""The Triton triangle-attention kernel (``ops/triton_attention.py``) against SDPA with the bias
expanded over the rows, on fresh random inputs: the projection's strided views, masked keys,
ragged row groups and query/key blocks, every launch setting the tuning script tries, with and
without the log-sum-exp; and the dispatch of ``ops/biased_attention.py`` under
``model.attention=triton``. In Triton's interpreter on the CPU (``TRITON_INTERPRET=1``, set by the
conftest where no GPU is present); bf16 on a GPU is ``scripts/kernel_parity.py``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cpbench.models.pairformer.ops import biased_attention, kernels, triton_attention, triton_passes
from cpbench.models.pairformer.parallel.padding import MASKED_LOGIT

pytestmark = pytest.mark.skipif(
    not triton_passes.HAS_TRITON or not (triton_passes.interpreted() or torch.cuda.is_available()),
    reason="Triton is not installed (pip install triton), or neither a GPU nor TRITON_INTERPRET=1")

DEVICE = "cuda" if torch.cuda.is_available() and not triton_passes.interpreted() else "cpu"
HEADS, D = 2, 16
TOL = dict(atol=2e-5, rtol=2e-5)


def inputs(rows: int, lq: int, lk: int, dtype: torch.dtype = torch.float32, masked_keys: int = 3):
    """q/k/v as the triangle attention hands them (views of one ``[rows, L, 4, heads, D]`` projection,
    ``[rows, heads, L, D]``; ``q`` from its own projection where ``lq != lk``), and a bias
    ``[heads, lq, lk]`` whose last ``masked_keys`` keys are masked."""
    proj = torch.randn(rows, lk, 4, HEADS, D, device=DEVICE, dtype=dtype)
    q, k, v, _ = (t.transpose(1, 2) for t in proj.unbind(2))
    if lq != lk:
        q = torch.randn(rows, lq, HEADS, D, device=DEVICE, dtype=dtype).transpose(1, 2)
    bias = torch.randn(HEADS, lq, lk, device=DEVICE, dtype=dtype)
    bias[:, :, lk - masked_keys:] += MASKED_LOGIT
    return q, k, v, bias


def reference(q, k, v, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) in float64: SDPA's math with the bias expanded, and the log-sum-exp of the logits."""
    q, k, v, bias = (t.double() for t in (q, k, v, bias))
    logits = q @ k.transpose(-1, -2) / D ** 0.5 + bias
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(0).expand(q.shape[0], -1, -1, -1))
    return o, torch.logsumexp(logits, dim=-1)


@pytest.mark.parametrize("rows, lq, lk", [(3, 37, 37), (4, 40, 70), (1, 16, 16)])
def test_matches_sdpa(rows, lq, lk):
    """Rows not a multiple of ``ROWS``, queries and keys not of the blocks, ``Lq != Lk`` (2d pieces)."""
    q, k, v, bias = inputs(rows, lq, lk)
    o, lse = triton_attention.attention(q, k, v, bias, with_lse=True)
    o_ref, lse_ref = reference(q, k, v, bias)
    torch.testing.assert_close(o.double(), o_ref, **TOL)
    torch.testing.assert_close(lse.double(), lse_ref, **TOL)
    assert lse.dtype == torch.float32 and lse.shape == (rows, HEADS, lq)
    torch.testing.assert_close(triton_attention.attention(q, k, v, bias), o, atol=0, rtol=0)


def test_output_is_a_view_of_the_gated_output_layout():
    """``o.transpose(1, 2)`` is contiguous ``[rows, L, heads, D]``: the caller's reshape to
    ``[rows, L, heads·D]`` is a view, not a copy."""
    q, k, v, bias = inputs(2, 20, 20)
    o = triton_attention.attention(q, k, v, bias)
    assert o.shape == (2, HEADS, 20, D) and o.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("tiles", [dict(ROWS=1, BLOCK_M=16, BLOCK_N=16), dict(ROWS=2, BLOCK_M=32, BLOCK_N=16),
                                   dict(ROWS=2, BLOCK_M=16, BLOCK_N=64, num_warps=8)],
                         ids=["rows1", "rows2", "wide-keys"])
def test_every_launch_setting_agrees(tiles):
    """The settings ``scripts/flex_microbench.py --cases triton`` tries compute the same attention."""
    q, k, v, bias = inputs(5, 33, 45)
    o, lse = triton_attention.attention(q, k, v, bias, with_lse=True, tiles=tiles)
    o_ref, lse_ref = reference(q, k, v, bias)
    torch.testing.assert_close(o.double(), o_ref, **TOL)
    torch.testing.assert_close(lse.double(), lse_ref, **TOL)


@pytest.mark.parametrize("rows_per_program", [1, 2])
@pytest.mark.parametrize("lq, lk", [(64, 96), (37, 45)], ids=["blocks-divide", "ragged"])
def test_blocks_that_divide_the_lengths_or_not(rows_per_program, lq, lk):
    """``Lq`` and ``Lk`` multiples of the blocks (the trunk's sizes: no load or score masked) or not."""
    q, k, v, bias = inputs(3, lq, lk)
    tiles = dict(ROWS=rows_per_program, BLOCK_M=32, BLOCK_N=32, num_stages=1)
    o, lse = triton_attention.attention(q, k, v, bias, with_lse=True, tiles=tiles)
    o_ref, lse_ref = reference(q, k, v, bias)
    torch.testing.assert_close(o.double(), o_ref, **TOL)
    torch.testing.assert_close(lse.double(), lse_ref, **TOL)


def test_half_precision_error_is_the_eager_kernels():
    """fp16 inputs (the interpreter computes bf16 dots wrongly; a GPU runs bf16): the kernel's
    error against float64 is no worse than SDPA's own fp16 (math kernel) error, norm-wise."""
    q, k, v, bias = inputs(3, 48, 48, torch.float16)
    o_ref, _ = reference(q, k, v, bias)
    o = triton_attention.attention(q, k, v, bias)
    eager = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                           attn_mask=bias.float().unsqueeze(0).expand(3, -1, -1, -1)).half()
    err, eager_err = ((t.double() - o_ref).norm() / o_ref.norm() for t in (o, eager))
    assert err <= 1.5 * eager_err + 1e-6, (err, eager_err)


def test_biased_attention_dispatches_without_autograd_only(monkeypatch):
    """Under ``flex`` with ``model.attention=triton``: the kernel without autograd (and the 2d
    ring's log-sum-exp), FlexAttention/SDPA with it; ``auto`` never runs it."""
    q, k, v, bias = inputs(2, 24, 24)
    calls = []
    real = triton_attention.attention
    monkeypatch.setattr(triton_attention, "attention", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    monkeypatch.setattr(kernels, "_active", "flex")
    o_ref, lse_ref = reference(q, k, v, bias)
    for choice, expected in (("auto", 0), ("triton", 2)):
        monkeypatch.setattr(kernels, "_attention", choice)
        calls.clear()
        with torch.no_grad():
            o = biased_attention.biased_attention(q, k, v, bias)
            _, lse = biased_attention.biased_attention_lse(q, k, v, bias)
        assert len(calls) == expected, (choice, calls)
        torch.testing.assert_close(o.double(), o_ref, **TOL)
        torch.testing.assert_close(lse.double(), lse_ref, **TOL)
    calls.clear()
    qg = q.detach().requires_grad_()
    biased_attention.biased_attention(qg, k, v, bias).sum().backward()
    assert not calls and qg.grad is not None


def test_attention_choice_is_validated():
    with pytest.raises(kernels.KernelError, match="model.attention"):
        kernels.select_attention("flash")


def test_the_microbench_tries_each_setting_against_flex(monkeypatch):
    """``scripts/flex_microbench.py --cases triton`` at a tiny size (interpreted: a check, not a
    measurement): flex's line, the default's, one per grid setting, each agreeing with flex."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import flex_microbench

    monkeypatch.setattr(flex_microbench, "TRITON_GRID", {"ROWS": (1, 2), "BLOCK_M": (16,), "BLOCK_N": (32,),
                                                         "num_warps": (4,), "num_stages": (1,)})
    lines = list(flex_microbench.triton_cases(24, 3, torch.device(DEVICE), torch.float32, repeats=1))
    settings = [f"ROWS{rows}_BLOCK_M16_BLOCK_N32_num_warps4_num_stages1" for rows in (1, 2)]
    assert [case for case, *_ in lines] == ["triton/flex_static", "triton/default", *(f"triton/{s}" for s in settings)]
    assert all(isinstance(ms, float) and diff < 1e-4 for _, ms, diff in lines), lines
