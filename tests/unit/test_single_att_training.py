"""The single attention's pair bias under autograd (``layers/single_att.py``): one fused LayerNorm
and projection (``ops.fused.norm_linear``: with ``model.passes=triton`` the Triton kernel and its
Triton backward, here in Triton's interpreter), with the eager module's values and every gradient
(z, the LayerNorm weight, the projection) on fresh random inputs."""

from __future__ import annotations

import os

import pytest
import torch

from cpbench.models.pairformer.layers import single_att
from cpbench.models.pairformer.ops import kernels, triton_passes

pytestmark = pytest.mark.skipif(not triton_passes.HAS_TRITON or not triton_passes.interpreted(),
                                reason="Triton is not installed (pip install triton), or not TRITON_INTERPRET=1")

C_S, C_Z, HEADS, R, C = 32, 32, 4, 5, 7  # 35 rows: a partial last tile


def test_pair_bias_under_autograd_is_one_triton_pass_with_the_eager_gradients(monkeypatch):
    monkeypatch.setattr(kernels, "_active", "flex")
    monkeypatch.setattr(kernels, "_passes", "triton")
    monkeypatch.setattr(kernels, "_compile_training", True)
    calls = []
    fused_norm_linear = single_att.norm_linear
    monkeypatch.setattr(single_att, "norm_linear", lambda *a: calls.append(a) or fused_norm_linear(*a))
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    op = single_att.AttentionPairBias(C_S, C_Z, HEADS)
    with torch.no_grad():
        op.norm_z.weight.mul_(torch.rand(C_Z) + 0.5)
    z = torch.randn(R, C, C_Z, requires_grad=True)
    keys = torch.randn(C)
    got = op.pair_bias(z, keys)
    want = (op.bias_proj(op.norm_z(z)).permute(2, 0, 1) + keys).contiguous()
    assert len(calls) == 1 and got.shape == (HEADS, R, C) and got.is_contiguous()
    torch.testing.assert_close(got, want, atol=5e-5, rtol=5e-5)
    cotangent = torch.randn_like(want)
    params = (z, op.norm_z.weight, op.bias_proj.weight)
    for name, g_got, g_want in zip(("z", "norm_z.weight", "bias_proj.weight"),
                                   torch.autograd.grad(got, params, cotangent),
                                   torch.autograd.grad(want, params, cotangent)):
        torch.testing.assert_close(g_got, g_want, atol=5e-5, rtol=5e-5, msg=lambda m, n=name: f"{n}: {m}")
