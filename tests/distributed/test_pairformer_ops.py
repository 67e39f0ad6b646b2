"""Serial Pairformer ops match AF3's formulas (dense einsum references), and their memory-lean
in-place chunked paths (no autograd) match their autograd paths."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cpbench.models.pairformer.layers.single_att import AttentionPairBias
from cpbench.models.pairformer.layers.transition import Transition
from cpbench.models.pairformer.layers.triatt import TriangleAttention
from cpbench.models.pairformer.layers.trimul import TriangleMultiplication
from cpbench.models.pairformer.modules.block import PairformerBlock
from cpbench.models.pairformer.parallel import chunking
from cpbench.models.pairformer.parallel.layout import serial_layout
from cpbench.models.pairformer.parallel.padding import MASKED_LOGIT

N, C_Z, C_S = 13, 8, 12


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(N, N, C_Z, generator=g)
    s = torch.randn(N, C_S, generator=g)
    mask = torch.rand(N, generator=g) > 0.3
    mask[0] = True
    return z, s, mask


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


def _dense_trimul(op: TriangleMultiplication, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = (mask[:, None] & mask[None, :]).float()[..., None]
    zn = op.norm_in(z)
    a, b = (op.proj_in(zn) * torch.sigmoid(op.gate_in(zn)) * m).chunk(2, dim=-1)
    eq = "kic,kjc->ijc" if op.incoming else "ikc,jkc->ijc"
    x = torch.einsum(eq, a, b)
    return z + op.proj_out(op.norm_out(x)) * torch.sigmoid(op.gate_out(zn))


def _dense_triatt(op: TriangleAttention, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    zz = z.transpose(0, 1) if op.ending else z
    zn = op.norm(zz)
    h, d = op.heads, op.head_dim
    q, k, v, g = op.qkvg(zn).view(N, N, 4, h, d).unbind(2)
    bias = op.bias_proj(zn)  # [j, k, h]
    logits = torch.einsum("ijhd,ikhd->ihjk", q, k) / d**0.5 + bias.permute(2, 0, 1)[None]
    logits = logits + (~mask).float() * MASKED_LOGIT
    o = torch.einsum("ihjk,ikhd->ijhd", logits.softmax(-1), v) * torch.sigmoid(g)
    out = zz + op.out(o.reshape(N, N, h * d))
    return out.transpose(0, 1) if op.ending else out


def _dense_single_att(op: AttentionPairBias, s, z, mask):
    h = op.heads
    d = C_S // h
    a = op.norm_s(s)
    q = op.q(a).view(N, h, d)
    k, v, g = op.kvg(a).chunk(3, dim=-1)
    logits = torch.einsum("ihd,jhd->hij", q, k.view(N, h, d)) / d**0.5
    logits = logits + op.bias_proj(op.norm_z(z)).permute(2, 0, 1) + (~mask).float() * MASKED_LOGIT
    o = torch.einsum("hij,jhd->ihd", logits.softmax(-1), v.view(N, h, d)).reshape(N, C_S)
    return s + op.out(o * torch.sigmoid(g))


def test_serial_ops_match_af3_formulas():
    torch.manual_seed(0)
    z, s, mask = _inputs(1)
    layout = serial_layout()
    for incoming in (False, True):
        op = TriangleMultiplication(C_Z, incoming=incoming)
        zz = z.transpose(0, 1) if incoming else z
        out = op(zz, mask, layout)
        out = out.transpose(0, 1) if incoming else out
        assert _rel(out, _dense_trimul(op, z, mask)) < 1e-5
    for ending in (False, True):
        op = TriangleAttention(C_Z, heads=2, head_dim=4, ending=ending)
        zz = z.transpose(0, 1) if ending else z
        out = op(zz, mask, layout)
        out = out.transpose(0, 1) if ending else out
        assert _rel(out, _dense_triatt(op, z, mask)) < 1e-5
    op = AttentionPairBias(C_S, C_Z, heads=3)
    assert _rel(op(s, z, mask, layout), _dense_single_att(op, s, z, mask)) < 1e-5
    op = Transition(C_Z, 4)
    zn = op.norm(z)
    a, b = op.proj_in(zn).chunk(2, dim=-1)
    assert _rel(op(z), z + op.proj_out(F.silu(a) * b)) < 1e-5


def test_lean_inplace_block_matches_autograd_block_with_tiny_chunks():
    torch.manual_seed(0)
    z, s, mask = _inputs(2)
    block = PairformerBlock(C_S, C_Z, heads_single=3, heads_tri=2, head_dim_tri=4, transition_factor=2)
    s_ref, z_ref = block(s.clone(), z.clone(), mask, serial_layout())
    with torch.no_grad(), chunking.override_budget(1):  # one row / one channel per chunk
        z_lean, s_lean = z.clone(), s.clone()
        storage = z_lean.untyped_storage().data_ptr()
        s_out, z_out = block(s_lean, z_lean, mask, serial_layout())
    assert z_out.untyped_storage().data_ptr() == storage  # updated in place
    assert _rel(z_out, z_ref.detach()) < 1e-5
    assert _rel(s_out, s_ref.detach()) < 1e-5
