"""2d context parallelism of the MSA module matches cp=1 on 2x2, 1x2 and 2x1 grids: the output
pair tile and every parameter gradient within 1e-5 relative error (norm-wise), with autograd and
on the chunked no-grad paths; the bytes counted by ``comm.BYTES`` for the outer product mean and
pair-weighted averaging are the documented volumes. The whole trunk with its MSA module, as the
adapter builds it under ``topology=2d`` (MSA columns of the tile rows per rank, recycling,
checkpointing), matches cp=1 likewise.

gloo, fp32, fresh random inputs, N=13 tokens (divisible by no grid axis) with padding tokens and
padding MSA rows, random garbage in the padded pair entries. Each rank computes the cp=1
reference itself (serial layout) and compares its own tile; one process spawn per grid.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from cpbench.data.sharding import pad_features
from cpbench.data.synthetic import make_synthetic_features
from cpbench.models.pairformer.adapter import PairformerAdapter, all_reduce_grads, trunk_loss
from cpbench.models.pairformer.modules.msa_module import MsaModule
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import layout_from_mesh, serial_layout

from helpers.dist import run_distributed
from helpers.parity import msa_module_case, rel_error

N, N_ATOMS, S = 13, 40, 6
C_S, C_Z = 16, 8
MSA = dict(c_m=8, c_z=C_Z, c_s=C_S, blocks=2, heads_tri=2, head_dim_tri=4, transition_factor=2, c_opm=4,
           heads_pwa=2, head_dim_pwa=4)
TOL = 1e-5
# Whole trunk (as in test_cp2d_parity / test_cp1d_parity): gradients norm-wise over the model at
# TOL, per parameter at TRUNK_PARAM_TOL (small-gradient parameters deep in the chain, such as the
# atom encoder's biases, see fp32 rounding of ~1e-5 relative).
TRUNK_PARAM_TOL = 1e-4
LEAN_BUDGET_B = 1024  # forces multi-chunk loops (S chunks, column chunks, pair rows)
FP32_B = 4
TRUNK = dict(c_s=C_S, c_z=C_Z, blocks=1, heads_single=2, heads_tri=2, head_dim_tri=4, transition_factor=2,
             c_atom=8, c_atompair=4, atom_blocks=1, atom_heads=2, c_m=8, msa_blocks=2)


def _features(seed: int, units: int) -> dict[str, torch.Tensor]:
    feats = make_synthetic_features(N, N_ATOMS, S, torch.Generator().manual_seed(seed))
    return pad_features(feats, units=units)[0]


def _check_trunk(mesh, seed: int, errors: dict) -> None:
    """The adapter's trunk (atom encoder, MSA module, one Pairformer block) at cp=1 and on the grid."""
    cpu = torch.device("cpu")
    built = {}
    for key, m, checkpointing in (("ref", None, False), ("cp", mesh, True)):
        adapter = PairformerAdapter(**TRUNK, dtype="fp32", recycles=1, checkpointing=checkpointing)
        torch.manual_seed(seed)
        model = adapter.build_model(m, cpu)
        torch.manual_seed(seed + 1)
        built[key] = (model, adapter.build_batch(N, N_ATOMS, S, m, cpu))
    (ref, ref_batch), (mod, batch) = built["ref"], built["cp"]
    layout = mod.layout
    n_pad = batch["token_mask"].shape[0]
    rows, cols = layout.rows(n_pad), layout.cols(n_pad)
    kr, kc = max(0, min(rows.stop, N) - rows.start), max(0, min(cols.stop, N) - cols.start)
    real_r, real_c = slice(rows.start, rows.start + kr), slice(cols.start, cols.start + kc)
    assert batch["msa"].shape == (S, rows.stop - rows.start)  # the MSA columns of the tile rows

    s_ref, z_ref = ref(ref_batch, ref.layout, recycles=1)
    trunk_loss(s_ref, z_ref, ref_batch["token_mask"], ref.layout).backward()
    s_cp, z_cp = mod(batch, layout, recycles=1, checkpointing=True)
    trunk_loss(s_cp, z_cp, batch["token_mask"], layout).backward()
    all_reduce_grads(mod, layout)
    if kr and kc:
        errors["trunk/z"] = rel_error(z_cp[:kr, :kc], z_ref[real_r, real_c])
    if kr:
        errors["trunk/s"] = rel_error(s_cp[:kr], s_ref[real_r])
    grads, grads_ref = [], []
    for (name, p), p_ref in zip(mod.named_parameters(), ref.parameters()):
        errors[f"trunk/grad/{name}"] = rel_error(p.grad, p_ref.grad)
        grads.append(p.grad.reshape(-1))
        grads_ref.append(p_ref.grad.reshape(-1))
    errors["trunk/grad_model"] = rel_error(torch.cat(grads), torch.cat(grads_ref))
    with torch.no_grad(), chunking.override_budget(LEAN_BUDGET_B):
        s_lean, z_lean = mod(batch, layout, recycles=1)
    if kr and kc:
        errors["trunk/lean_z"] = rel_error(z_lean[:kr, :kc], z_ref[real_r, real_c])


def _worker(rank: int, world: int, shape: tuple[int, int], seed: int) -> dict:
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("cp0", "cp1"))
    layout = layout_from_mesh(mesh)
    serial = serial_layout()
    ref_feats, feats = _features(seed, 1), _features(seed, layout.units)
    n_pad = feats["token_mask"].shape[0]
    rows, cols = layout.rows(n_pad), layout.cols(n_pad)
    kr, kc = max(0, min(rows.stop, N) - rows.start), max(0, min(cols.stop, N) - cols.start)
    real_r, real_c = slice(rows.start, rows.start + kr), slice(cols.start, cols.start + kc)
    # the adapter hands each rank the MSA columns of its tile rows only
    z, wz, s_inputs, g, ref, mod = msa_module_case(feats, rows, MSA, seed, seed + 1)
    errors: dict[str, float] = {}

    z_ref = z[:N, :N].clone().requires_grad_()
    z_out_ref = ref(ref_feats, s_inputs[:N], z_ref, serial)
    (z_out_ref * wz[:N, :N]).sum().backward()
    z_loc = z[rows, cols].clone().requires_grad_()
    z_out = mod(feats, s_inputs, z_loc, layout)
    (z_out[:kr, :kc] * wz[real_r, real_c]).sum().backward()  # this rank's share of the loss
    all_reduce_grads(mod, layout)
    if kr and kc:  # a tile of padding only has nothing to compare
        errors["z"] = rel_error(z_out[:kr, :kc], z_out_ref[real_r, real_c])
        errors["grad_z"] = rel_error(z_loc.grad[:kr, :kc], z_ref.grad[real_r, real_c])
    for (name, p), p_ref in zip(mod.named_parameters(), ref.parameters()):
        assert p.grad is not None and p_ref.grad is not None, f"{name}: no gradient"
        errors[f"grad/{name}"] = rel_error(p.grad, p_ref.grad)

    volumes: dict[str, int] = {}
    with torch.no_grad(), chunking.override_budget(LEAN_BUDGET_B):
        z_lean = mod(feats, s_inputs, z[rows, cols].clone(), layout)
        if kr and kc:
            errors["lean_z"] = rel_error(z_lean[:kr, :kc], z_out_ref[real_r, real_c])
        # Volumes of the two MSA <-> pair ops alone, on the chunked path.
        m = torch.randn(S, rows.stop - rows.start, MSA["c_m"], generator=g)
        opm, pwa = mod.blocks[0].outer_product_mean, mod.blocks[0].pair_weighted_averaging
        comm.BYTES.reset()
        opm(m, z[rows, cols].clone(), feats["msa_mask"], layout)
        volumes["opm_b"] = comm.BYTES.sent_b
        comm.BYTES.reset()
        pwa(m, z[rows, cols].clone(), feats["token_mask"], layout)
        volumes["pwa_b"] = comm.BYTES.sent_b
    _check_trunk(mesh, seed + 2, errors)
    return {"errors": errors, "volumes": volumes, "n_pad": n_pad,
            "lean_chunks": S * (rows.stop - rows.start) * MSA["c_m"] * FP32_B > LEAN_BUDGET_B}


def _ring_b(ranks: int, elements: float) -> int:
    """``comm``'s all-reduce volume of ``elements`` fp32 values over ``ranks`` ranks."""
    return int(2 * (ranks - 1) * elements * FP32_B / ranks) if ranks > 1 else 0


@pytest.mark.parametrize("shape", [(2, 2), (1, 2), (2, 1)], ids=["2x2", "1x2", "2x1"])
def test_msa_module_and_its_trunk_on_2d_grids_match_cp1_with_documented_volumes(shape):
    seed = int.from_bytes(os.urandom(4), "little")
    cp0, cp1 = shape
    cp = cp0 * cp1
    results = run_distributed(_worker, cp, args=(shape, seed), timeout_s=240)
    for rank, res in enumerate(results):
        bad = {k: v for k, v in res["errors"].items()
               if not v < (TRUNK_PARAM_TOL if k.startswith("trunk/grad/") else TOL)}
        assert not bad, f"grid {cp0}x{cp1} seed {seed} rank {rank}: relative errors above {TOL}: {bad}"
        assert res["lean_chunks"], "the no-grad paths ran in one chunk: the chunked loops went untested"
        n_rows = res["n_pad"] // cp0
        h, d, c = MSA["heads_pwa"], MSA["head_dim_pwa"], MSA["c_opm"]
        agree_b = int(2 * (cp - 1) * 8 / cp)  # the int64 all-reduce that agrees the chunk budget
        # gather of b and the mask along the grid column (budget + chunk count agreed)
        assert res["volumes"]["opm_b"] == FP32_B * (cp0 - 1) * S * n_rows * (c + 1) + agree_b
        # gather of v along the grid column; max and sum of the log-sum-exps and the partial
        # outputs all-reduced along the grid row
        pwa_b = FP32_B * (cp0 - 1) * S * n_rows * h * d + 2 * _ring_b(cp1, n_rows * h) + _ring_b(cp1, S * n_rows * h * d)
        assert res["volumes"]["pwa_b"] == pwa_b + agree_b
    names = results[0]["errors"]
    assert sum(k.startswith("grad/") for k in names) == len(list(MsaModule(**MSA).parameters()))
    assert sum(k.startswith("trunk/grad/msa_module.") for k in names) == len(list(MsaModule(
        TRUNK["c_m"], C_Z, C_S, TRUNK["msa_blocks"], 2, 4, 2).parameters()))
