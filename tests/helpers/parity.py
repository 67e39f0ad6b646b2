"""Shared pieces of the parity and memory tests: the error measure, the per-op cases of a
Pairformer block, and torch's own peak-memory accounting of one call on the CPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from cpbench.models.pairformer.adapter import all_reduce_grads, trunk_loss
from cpbench.models.pairformer.layers.single_att import AttentionPairBias
from cpbench.models.pairformer.layers.transition import Transition
from cpbench.models.pairformer.layers.triatt import TriangleAttention
from cpbench.models.pairformer.layers.trimul import TriangleMultiplication
from cpbench.models.pairformer.modules.block import PairformerBlock
from cpbench.models.pairformer.parallel.layout import Layout, serial_layout
from cpbench.models.pairformer.parallel.transpose import transpose_pair


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Norm-wise relative error ``|a - b| / |b|`` in float64 (0 when equal)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30)) if (a - b).norm() > 0 else 0.0


def _pair_op(op):
    return lambda s, z, m, layout: (s, op(z, m, layout))


def _pair_op_transposed(op):
    """Incoming / ending ops read Z^T rows: switch there and back."""
    return lambda s, z, m, layout: (s, transpose_pair(op(transpose_pair(z, layout), m, layout), layout))


def block_cases(c_s: int, c_z: int, heads_s: int, heads_t: int, head_dim: int, factor: int) -> dict:
    """``{name: (build_module, wrap)}`` for every op of a block and the block itself; ``wrap(module)``
    is a callable ``(s, z, token_mask, layout) -> (s, z)`` on the op's natural layout."""
    return {
        "tri_mul_out": (lambda: TriangleMultiplication(c_z), _pair_op),
        "tri_mul_in": (lambda: TriangleMultiplication(c_z, incoming=True), _pair_op_transposed),
        "tri_att_start": (lambda: TriangleAttention(c_z, heads_t, head_dim), _pair_op),
        "tri_att_end": (lambda: TriangleAttention(c_z, heads_t, head_dim, ending=True), _pair_op_transposed),
        "pair_transition": (lambda: Transition(c_z, factor), lambda op: lambda s, z, m, layout: (s, op(z))),
        "single_attention": (lambda: AttentionPairBias(c_s, c_z, heads_s),
                             lambda op: lambda s, z, m, layout: (op(s, z, m, layout), z)),
        "block": (lambda: PairformerBlock(c_s, c_z, heads_s, heads_t, head_dim, factor), lambda op: op),
    }


def peak_bytes(module: torch.nn.Module, *args) -> int:
    """Peak CPU bytes of ``module(*args)`` without autograd, by torch's MemTracker (parameters,
    inputs and every transient it allocates)."""
    tracker = MemTracker()
    tracker.track_external(module)
    with tracker, torch.no_grad():
        module(*args)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


# Whole-trunk checks: through the input embedding (atom encoder, MSA module) and recycling, a
# LayerNorm bias's gradient is a sum over N² positions that largely cancels, so its own norm is
# a poor scale for fp32 rounding; and AdamW divides each component by its own gradient scale, so
# a component whose gradient is ~0 carries that rounding into its update. The trunk's gradients
# are therefore held to TOL norm-wise over the model, its trained parameters to TRAINED_PARAM_TOL
# norm-wise (reported scaled to TOL, so one threshold reads every entry; below); ops, single
# blocks, the atom encoder and the MSA module stay per parameter at TOL.
TOL = 1e-5


def record_trunk_grad_errors(errors: dict, mod: torch.nn.Module, ref: torch.nn.Module,
                             key: str = "trunk/grads") -> None:
    """``errors[key]``: the whole trunk's gradient vector, norm-wise at TOL.

    Not per parameter: through the whole trunk, gradients that are sums with heavy cancellation
    (LayerNorm biases, the atom encoder's pair MLP) carry fp32 rounding far above their own norm
    (4e-4 measured once for ``atom_encoder.pair_mlp.1.weight`` at cp=4 while the model-wide error
    was below 1e-5). Every parameter is still checked on its own at TOL where it lives: each op
    and block (tests/test_cp*_parity.py), the atom encoder and MSA module
    (tests/*/test_atom_encoder_msa_parity.py, tests/*/test_msa_2d_parity.py).
    """
    grads = torch.cat([p.grad.reshape(-1) for p in mod.parameters()])
    grads_ref = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
    errors[key] = rel_error(grads, grads_ref)


def record_blocks_only_grad_errors(errors: dict, mod: torch.nn.Module, ref: torch.nn.Module, batch: dict,
                                   layout: Layout) -> None:
    """``errors["trunk/grads_blocks_only"]``: the sharded trunk ``mod`` (its grads zeroed) trained
    with the blocks only checkpointed (``model.checkpoint_ops=false``: ``recycles=1``, gradients
    all-reduced over the layout) against ``ref``'s gradients, as ``record_trunk_grad_errors``;
    ``mod``'s grads are zeroed again after."""
    s, z = mod(batch, layout, recycles=1, checkpointing=True, checkpoint_ops=False)
    trunk_loss(s, z, batch["token_mask"], layout).backward()
    all_reduce_grads(mod, layout)
    record_trunk_grad_errors(errors, mod, ref, key="trunk/grads_blocks_only")
    mod.zero_grad(set_to_none=True)


# The losses after AdamW steps: AdamW moves a component whose gradient is ~0 by a full ±lr step
# whose sign is the rounding's, and the loss then depends on those components. Seed 243788219
# (cp=2) gave relative differences of 1.3e-4 and 5.3e-4 at steps 2 and 3, on this session's code
# and on the commit before it (929898a) alike, with the gradients within TOL and the trained
# parameters within 1e-4 norm-wise. A sharding error moves the first step's loss (held
# to TOL) and the gradients; this bound only keeps the later steps in line.
TRAINED_LOSS_TOL = 1e-3
# The trained parameters, for the same reason: at cp=2 (2026-12-07) six seeds' norm-wise difference
# after three steps ran from 3.8e-8 to 7.5e-6, and seed 3206328317 gave 1.05e-4 (over 1e-4), from
# 1,767 components of the MSA module's first outer-product-mean output weight (up to 1.2e-3 apart,
# within what three AdamW steps of lr 1e-4 can move a component whose gradient's sign is the
# rounding's), with every gradient within TOL before the steps.
TRAINED_PARAM_TOL = 1e-3


def assert_training_losses_match(cp_losses: list[float], ref: list[float], context: tuple) -> None:
    """The sharded run's training losses against the serial run's: the first step's at TOL; the
    later ones come after AdamW steps, which carry the rounding of ~0 gradient components into the
    update (above), so they are held to TRAINED_LOSS_TOL (at TOL this check failed 2 of 6 runs on
    the commit before the layout refactor, at 1e-4 once in a CI rehearsal)."""
    assert abs(cp_losses[0] - ref[0]) <= TOL * abs(ref[0]), (*context, cp_losses, ref)
    assert all(abs(a - b) <= TRAINED_LOSS_TOL * abs(b) for a, b in zip(cp_losses, ref)), (*context, cp_losses, ref)


def record_trained_param_errors(errors: dict, mod: torch.nn.Module, ref: torch.nn.Module) -> None:
    """``errors["train3/params"]``: the trained parameters norm-wise over the model, scaled."""
    flat = torch.cat([p.detach().reshape(-1) for p in mod.parameters()])
    flat_ref = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    errors["train3/params"] = rel_error(flat, flat_ref) * TOL / TRAINED_PARAM_TOL


def msa_module_case(feats: dict, rows: slice, msa: dict, seed: int, data_seed: int) -> tuple:
    """The inputs and the twin modules of an MSA-module parity check on one rank.

    Keeps only this rank's MSA columns ``rows`` in ``feats`` (in place, as the adapter hands
    them out) and returns ``(z, wz, s_inputs, g, ref, mod)``: a random global pair input ``z``
    and loss weights ``wz`` (``[N_pad, N_pad, c_z]``, garbage in the padding) and ``s_inputs``
    (``[N_pad, c_s]``) drawn from the generator ``g`` seeded with ``data_seed`` (returned for
    further draws), and two ``MsaModule(**msa)`` with the same weights from ``seed`` (one to
    run serially, one sharded)."""
    from cpbench.data.synthetic import MSA_KEYS
    from cpbench.models.pairformer.modules.msa_module import MsaModule

    for key in MSA_KEYS:
        feats[key] = feats[key][:, rows].contiguous()
    n_pad = feats["token_mask"].shape[0]
    g = torch.Generator().manual_seed(data_seed)
    z, wz = torch.randn(2, n_pad, n_pad, msa["c_z"], generator=g)
    s_inputs = torch.randn(n_pad, msa["c_s"], generator=g)
    torch.manual_seed(seed)
    ref = MsaModule(**msa)
    torch.manual_seed(seed)
    return z, wz, s_inputs, g, ref, MsaModule(**msa)


@dataclass
class OpCase:
    """One op's parity setup on a rank: global random inputs ``z, wz: [n_max_pad, n_max_pad,
    c_z]`` and ``s, ws: [n_max_pad, c_s]`` (loss weights ``w*``; garbage in the padding), the
    token ``mask: [n_max_pad]`` (token 0 real, some real tokens masked, padding masked), the
    twin modules ``ref`` (run here, serially) and ``mod`` (same weights, for the sharded run),
    and the reference run: its inputs ``z_ref, s_ref`` (with gradients) and outputs."""

    z: torch.Tensor
    wz: torch.Tensor
    s: torch.Tensor
    ws: torch.Tensor
    mask: torch.Tensor
    ref: torch.nn.Module
    mod: torch.nn.Module
    z_ref: torch.Tensor
    s_ref: torch.Tensor
    z_out: torch.Tensor
    s_out: torch.Tensor


def op_case(cases: dict, name: str, seed: int, n: int, n_max_pad: int, c_s: int, c_z: int) -> OpCase:
    """Draw the inputs of ``cases[name]`` (``block_cases``) from ``seed``, build its twin
    modules and run the cp=1 reference forward and backward (loss ``Σ z_out·wz + Σ s_out·ws``
    over the ``n`` real tokens)."""
    g = torch.Generator().manual_seed(seed)
    z, wz = torch.randn(2, n_max_pad, n_max_pad, c_z, generator=g)
    s, ws = torch.randn(2, n_max_pad, c_s, generator=g)
    mask = torch.rand(n_max_pad, generator=g) > 0.3
    mask[0], mask[n:] = True, False
    make, wrap = cases[name]
    torch.manual_seed(seed)
    ref = make()
    torch.manual_seed(seed)
    mod = make()
    z_ref = z[:n, :n].clone().requires_grad_()
    s_ref = s[:n].clone().requires_grad_()
    s_out, z_out = wrap(ref)(s_ref, z_ref, mask[:n], serial_layout())
    ((z_out * wz[:n, :n]).sum() + (s_out * ws[:n]).sum()).backward()
    return OpCase(z, wz, s, ws, mask, ref, mod, z_ref, s_ref, z_out, s_out)
