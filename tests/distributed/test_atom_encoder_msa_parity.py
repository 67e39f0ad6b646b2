"""1d context parallelism of the trunk's atom encoder and MSA module matches cp=1: outputs and
every parameter gradient within 1e-5 relative error (norm-wise), with autograd and on the
chunked no-grad paths; the bytes counted by ``comm.BYTES`` are the documented volumes.

gloo, fp32, fresh random inputs, N=13 tokens (not divisible by 2 or 4) with padding tokens,
padding atoms and padding MSA rows. The reference is the true cp=1 input (features padded for
one rank), so the atom encoder is also checked to be independent of the padded layout; at
cp=4 each rank holds 32 atom slots, so a 128-key window spans several ranks. Each rank
computes the reference itself (serial layout) and compares its own shard; one spawn per cp.
"""

from __future__ import annotations

import os

import pytest
import torch

from cpbench.data.sharding import pad_features
from cpbench.data.synthetic import make_synthetic_features
from cpbench.models.pairformer.adapter import all_reduce_grads
from cpbench.models.pairformer.layers.msa_ops import OuterProductMean, PairWeightedAveraging
from cpbench.models.pairformer.modules.atom_encoder import AtomAttentionEncoder
from cpbench.models.pairformer.modules.msa_module import MsaModule
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import layout_1d, serial_layout

from helpers.dist import run_distributed
from helpers.parity import msa_module_case, rel_error

N, N_ATOMS, S = 13, 70, 6
C_S, C_Z, C_ATOM, C_ATOMPAIR, ATOM_BLOCKS, ATOM_HEADS = 16, 8, 8, 4, 2, 2
MSA = dict(c_m=8, c_z=C_Z, c_s=C_S, blocks=2, heads_tri=2, head_dim_tri=4, transition_factor=2, c_opm=4,
           heads_pwa=2, head_dim_pwa=4)
TOL = 1e-5
LEAN_BUDGET_B = 1024  # forces multi-chunk loops (windows, S chunks, column chunks, pair rows)
FP32_B = 4



def _grad_errors(prefix: str, mod: torch.nn.Module, ref: torch.nn.Module, errors: dict) -> None:
    """Relative error of every parameter gradient (every parameter has one on both sides: the
    modules hold no parameter whose exact gradient is zero, which would compare rounding noise)."""
    for (name, p), p_ref in zip(mod.named_parameters(), ref.parameters()):
        assert p.grad is not None and p_ref.grad is not None, f"{prefix}/{name}: no gradient"
        errors[f"{prefix}/grad/{name}"] = rel_error(p.grad, p_ref.grad)


def _features(seed: int, units: int) -> dict[str, torch.Tensor]:
    feats = make_synthetic_features(N, N_ATOMS, S, torch.Generator().manual_seed(seed))
    return pad_features(feats, units=units)[0]


def _check_atom_encoder(seed: int, errors: dict, volumes: dict) -> None:
    layout, serial = layout_1d(), serial_layout()
    ref_feats, feats = _features(seed, 1), _features(seed, layout.size)
    rows = layout.rows(feats["token_mask"].shape[0])
    k = min(rows.stop, N) - rows.start  # real rows held here
    real = slice(rows.start, rows.start + k)
    weight = torch.randn(N, C_S, generator=torch.Generator().manual_seed(seed + 1))
    torch.manual_seed(seed)
    ref = AtomAttentionEncoder(C_ATOM, C_ATOMPAIR, C_S, ATOM_BLOCKS, ATOM_HEADS)
    torch.manual_seed(seed)
    mod = AtomAttentionEncoder(C_ATOM, C_ATOMPAIR, C_S, ATOM_BLOCKS, ATOM_HEADS)

    a_ref = ref(ref_feats, serial)
    (a_ref[:N] * weight).sum().backward()
    comm.BYTES.reset()
    a = mod(feats, layout)  # [N_pad, c_s], global on every rank
    volumes["atom_encoder_b"] = comm.BYTES.sent_b
    (a[real] * weight[real]).sum().backward()  # this rank's share of the global loss
    all_reduce_grads(mod, layout)
    errors["atom/a"] = rel_error(a[:N], a_ref[:N])
    _grad_errors("atom", mod, ref, errors)
    with torch.no_grad(), chunking.override_budget(LEAN_BUDGET_B):
        errors["atom/lean_a"] = rel_error(mod(feats, layout)[:N], a_ref[:N])
    errors["atom/layout_invariant"] = rel_error(ref(feats, serial)[:N], a_ref[:N])


def _check_msa_module(seed: int, errors: dict, volumes: dict) -> None:
    layout, serial = layout_1d(), serial_layout()
    ref_feats, feats = _features(seed, 1), _features(seed, layout.size)
    n_pad = feats["token_mask"].shape[0]
    rows = layout.rows(n_pad)
    k = min(rows.stop, N) - rows.start
    real = slice(rows.start, rows.start + k)
    z, wz, s_inputs, g, ref, mod = msa_module_case(feats, rows, MSA, seed, seed + 2)  # this rank's MSA columns

    z_ref = z[:N, :N].clone().requires_grad_()
    z_out_ref = ref(ref_feats, s_inputs[:N], z_ref, serial)
    (z_out_ref * wz[:N, :N]).sum().backward()
    z_loc = z[rows].clone().requires_grad_()
    z_out = mod(feats, s_inputs, z_loc, layout)
    (z_out[:k, :N] * wz[real, :N]).sum().backward()
    all_reduce_grads(mod, layout)
    errors["msa/z"] = rel_error(z_out[:k, :N], z_out_ref[real])
    errors["msa/grad_z"] = rel_error(z_loc.grad[:k, :N], z_ref.grad[real])
    _grad_errors("msa", mod, ref, errors)
    with torch.no_grad(), chunking.override_budget(LEAN_BUDGET_B):
        z_lean = mod(feats, s_inputs, z[rows].clone(), layout)
        errors["msa/lean_z"] = rel_error(z_lean[:k, :N], z_out_ref[real])
        # Volumes of the two MSA <-> pair ops alone, on the chunked path.
        m = torch.randn(S, rows.stop - rows.start, MSA["c_m"], generator=g)
        opm, pwa = mod.blocks[0].outer_product_mean, mod.blocks[0].pair_weighted_averaging
        comm.BYTES.reset()
        opm(m, z[rows].clone(), feats["msa_mask"], layout)
        volumes["opm_b"] = comm.BYTES.sent_b
        comm.BYTES.reset()
        pwa(m, z[rows].clone(), feats["token_mask"], layout)
        volumes["pwa_b"] = comm.BYTES.sent_b


def _worker(rank: int, world: int, seed: int) -> dict:
    errors: dict[str, float] = {}
    volumes: dict[str, int] = {}
    _check_atom_encoder(seed, errors, volumes)
    _check_msa_module(seed + 10, errors, volumes)
    n_atoms_pad = _features(seed, world)["atom_mask"].shape[0]
    return {"errors": errors, "volumes": volumes, "n_atoms_pad": n_atoms_pad}


@pytest.mark.parametrize("cp", [2, 4])
def test_atom_encoder_and_msa_module_at_cp_match_cp1_with_documented_volumes(cp):
    seed = int.from_bytes(os.urandom(4), "little")
    results = run_distributed(_worker, cp, args=(seed,), timeout_s=240)
    n_local = -(-N // cp)  # tokens per rank
    for rank, res in enumerate(results):
        bad = {k: v for k, v in res["errors"].items() if not v < TOL}
        assert not bad, f"seed {seed} rank {rank}: relative errors above {TOL}: {bad}"
        vol = res["volumes"]
        atoms_local = res["n_atoms_pad"] // cp
        # per block an all-gather of local keys+values, then one of the token features
        assert vol["atom_encoder_b"] == FP32_B * (cp - 1) * (ATOM_BLOCKS * atoms_local * 2 * C_ATOM + n_local * C_S)
        agree_b = int(2 * (cp - 1) * 8 / cp)  # the int64 all-reduce that fixes the chunk budget
        assert vol["opm_b"] == FP32_B * (cp - 1) * S * n_local * (MSA["c_opm"] + 1) + agree_b
        assert vol["pwa_b"] == FP32_B * (cp - 1) * S * n_local * MSA["heads_pwa"] * MSA["head_dim_pwa"] + agree_b
    names = results[0]["errors"]
    assert sum(k.startswith("atom/grad/") for k in names) == len(list(AtomAttentionEncoder(
        C_ATOM, C_ATOMPAIR, C_S, ATOM_BLOCKS, ATOM_HEADS).parameters()))
    assert sum(k.startswith("msa/grad/") for k in names) == len(list(MsaModule(**MSA).parameters()))


def test_opm_and_pwa_lean_paths_match_autograd_paths_serially():
    """The chunked no-grad paths of both ops equal their autograd paths (serial layout)."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    m = torch.randn(S, N, 8, generator=g)
    z = torch.randn(N, N, C_Z, generator=g)
    msa_mask = torch.rand(S, N, generator=g) > 0.2
    token_mask = torch.rand(N, generator=g) > 0.2
    token_mask[0] = True
    opm, pwa = OuterProductMean(8, C_Z, 4), PairWeightedAveraging(8, C_Z, 2, 4)
    full_z = opm(m, z.clone(), msa_mask, serial_layout())
    full_m = pwa(m.clone(), z, token_mask, serial_layout())
    with torch.no_grad(), chunking.override_budget(256):
        assert rel_error(opm(m, z.clone(), msa_mask, serial_layout()), full_z) < TOL
        assert rel_error(pwa(m.clone(), z, token_mask, serial_layout()), full_m) < TOL

