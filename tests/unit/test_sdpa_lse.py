"""Attention with log-sum-exp: the contract, and the check that picks a CUDA kernel.

The CUDA kernels cannot run here; the pick (first candidate that runs and agrees with the
reference on a few query rows) is exercised with CPU kernels standing in for them.
"""

import math

import torch

from cpbench.models.pairformer.ops import sdpa_lse


def _inputs(seed: int = 0, b: int = 3, h: int = 4, lq: int = 40, lk: int = 24, d: int = 32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for n in (lq, lk, lk))
    bias = torch.randn(1, h, lq, lk, generator=g).expand(b, -1, -1, -1)
    return q, k, v, bias


def _math(q, k, v, bias):
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    return torch.softmax(logits, -1) @ v, torch.logsumexp(logits, -1)


def test_cpu_kernel_returns_the_output_and_the_natural_log_sum_exp():
    q, k, v, bias = _inputs()
    o, lse = sdpa_lse.sdpa_with_lse(q, k, v, bias)
    o_ref, lse_ref = _math(q, k, v, bias)
    assert lse.shape == (3, 4, 40)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-5, atol=1e-5)


def test_pick_skips_a_kernel_that_fails_or_disagrees():
    q, k, v, bias = _inputs(seed=1)
    calls = []

    def fails(*args):
        calls.append("fails")
        raise RuntimeError("cuDNN Frontend error: No valid execution plans")

    def base2(*args):  # right output, log-sum-exp in base 2
        calls.append("base2")
        o, lse = _math(*args)
        return o, lse / math.log(2)

    def good(*args):
        calls.append("good")
        return sdpa_lse.sdpa_with_lse(*args)

    picked = sdpa_lse.first_agreeing([("fails", fails), ("base2", base2), ("good", good)], _math,
                                     q, k, v, bias)
    assert picked == "good" and calls == ["fails", "base2", "good"]
    assert sdpa_lse.first_agreeing([("fails", fails), ("base2", base2)], _math, q, k, v, bias) is None


def test_the_pick_runs_on_a_few_query_rows_only():
    q, k, v, bias = _inputs(seed=2, lq=100)
    seen = []

    def spy(q_c, k_c, v_c, bias_c):
        seen.append((q_c.shape[2], bias_c.shape[2]))
        return _math(q_c, k_c, v_c, bias_c)

    assert sdpa_lse.first_agreeing([("spy", spy)], _math, q, k, v, bias) == "spy"
    assert seen == [(sdpa_lse._CHECK_ROWS, sdpa_lse._CHECK_ROWS)]
    assert sdpa_lse.kernel_in_use() is None  # no CUDA call in this process


def test_log_sum_exp_rows_from_either_kernel_layout():
    lse = torch.randn(2, 4, 40)
    padded = torch.cat([lse, torch.full((2, 4, 8), float("nan"))], -1)  # memory-efficient: Lq padded
    assert torch.equal(sdpa_lse.lse_rows(padded, 40), lse)
    assert torch.equal(sdpa_lse.lse_rows(lse.unsqueeze(-1), 40), lse)  # cuDNN: [B, h, Lq, 1]
