"""1d and 2d context parallelism of the diffusion module match cp=1: the pair conditioning, one
denoiser call, and a whole sampler run (fixed noise, fp32), within 1e-5 relative error.

gloo, fresh random trunk outputs, N=13 tokens (not divisible by 2 or 4) with padding tokens
and padding atoms; about 5 atoms per token, so at cp=4 a rank holds fewer atoms than a window's
48-atom reach and windows take keys from two ranks away. Each rank computes the cp=1
reference itself (serial layout, no collectives, the example padded for one rank: other token
and atom padding than the sharded run) and compares its own real tokens and real atoms; every
check runs twice, the second time with a tiny chunk budget that forces the chunked no-grad
paths. One process spawn per cp.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from cpbench.data.sharding import pad_features
from cpbench.data.synthetic import make_synthetic_features
from cpbench.models.pairformer.modules.diffusion import DiffusionModule
from cpbench.models.pairformer.modules.sampler import sample
from cpbench.models.pairformer.parallel import chunking
from cpbench.models.pairformer.parallel.layout import layout_1d, layout_from_mesh, serial_layout

from helpers.dist import run_distributed
from helpers.parity import rel_error

N, N_ATOMS, C_S, C_Z = 13, 60, 16, 8
SIZES = dict(c_token=16, blocks=2, heads=2, c_atom=8, c_atompair=4, atom_blocks=2, atom_heads=2, c_fourier=8)
STEPS, SAMPLES = 3, 2
TOL = 1e-5
LEAN_BUDGET_B = 1024  # forces multi-chunk loops (pair rows, query rows, atom windows)



def _real_atoms(x: torch.Tensor, atom_mask: torch.Tensor) -> torch.Tensor:
    """``x: [S, A, 3]`` over atom slots -> ``[S, n_real_here, 3]``, the real atoms in order."""
    return x[:, atom_mask]


def _check(seed: int, budget_b: int | None, layout) -> dict[str, float]:
    serial = serial_layout()
    g = torch.Generator().manual_seed(seed)
    raw = make_synthetic_features(N, N_ATOMS, 1, g)
    ref_feats, _ = pad_features(raw, units=1)  # cp=1 pads nothing but the atom block to 32
    feats, _ = pad_features(raw, units=layout.units)
    n_pad = feats["token_mask"].shape[0]
    rows, cols = layout.rows(n_pad), layout.cols(n_pad)
    # Trunk outputs on the real tokens; random garbage on the padding tokens of the sharded run.
    s_trunk, s_inputs = torch.randn(2, n_pad, C_S, generator=g)
    z = torch.randn(n_pad, n_pad, C_Z, generator=g)
    torch.manual_seed(seed)
    module = DiffusionModule(C_S, C_Z, **SIZES)
    real_rows = torch.arange(rows.start, rows.stop)[feats["token_mask"][rows]]
    real_cols = torch.arange(cols.start, cols.stop)[feats["token_mask"][cols]]
    errors = {}
    with torch.no_grad(), chunking.override_budget(budget_b):
        ref = module.prepare(s_trunk[:N], z[:N, :N].clone(), s_inputs[:N], ref_feats, serial)
        ctx = module.prepare(s_trunk[rows], z[rows, cols].clone(), s_inputs, feats, layout)
        errors["z_hat"] = rel_error(ctx.z_hat[real_rows - rows.start][:, real_cols - cols.start],
                               ref.z_hat[real_rows][:, real_cols])

        mine = ctx.real_index[ctx.atom_mask]  # global order of this rank's real atoms
        # High noise levels: the output is mostly the network's update, not the skip term.
        t = torch.tensor([160.0, 60.0])
        x_real = t[:, None, None] * torch.randn(SAMPLES, ref.n_real, 3, generator=g)
        x_ref = torch.zeros(SAMPLES, ref_feats["atom_mask"].shape[0], 3)
        x_ref[:, ref_feats["atom_mask"]] = x_real
        x_local = torch.zeros(SAMPLES, ctx.local.stop - ctx.local.start, 3)
        x_local[:, ctx.atom_mask] = x_real[:, mine]
        errors["denoiser"] = rel_error(_real_atoms(module(x_local, t, ctx), ctx.atom_mask),
                                  _real_atoms(module(x_ref, t, ref), ref.atom_mask)[:, mine])
        errors["sampler"] = rel_error(_real_atoms(sample(module, ctx, STEPS, SAMPLES, seed=seed), ctx.atom_mask),
                                 _real_atoms(sample(module, ref, STEPS, SAMPLES, seed=seed), ref.atom_mask)[:, mine])
    return errors


def _worker(rank: int, world_size: int, seed: int, grid: tuple[int, int] | None) -> dict[str, dict[str, float]]:
    layout = layout_1d() if grid is None else layout_from_mesh(
        init_device_mesh("cpu", grid, mesh_dim_names=("cp0", "cp1")))
    return {"default": _check(seed, None, layout), "lean": _check(seed, LEAN_BUDGET_B, layout)}


def _assert_parity(cp: int, grid: tuple[int, int] | None) -> None:
    seed = int(torch.randint(0, 2**31, (1,)))  # fresh inputs every run; printed on failure
    per_rank = run_distributed(_worker, cp, args=(seed, grid), timeout_s=240)
    worst = {f"{budget}/{name}": max(r[budget][name] for r in per_rank)
             for budget in per_rank[0] for name in per_rank[0][budget]}
    assert all(err < TOL for err in worst.values()), f"seed {seed}, cp={cp}, grid {grid}: {worst}"


@pytest.mark.parametrize("cp", [2, 4])
def test_1d_diffusion_matches_serial_at_n_not_divisible(cp: int) -> None:
    _assert_parity(cp, None)


def test_2d_diffusion_on_a_2x2_grid_matches_serial() -> None:
    _assert_parity(4, (2, 2))
