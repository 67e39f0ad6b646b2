"""2d context parallelism matches cp=1 on square and non-square grids: every op, one block, the
whole trunk, three training steps; outputs and every gradient within 1e-5 relative error
(norm-wise). Plus the per-block byte count and the grid transpose / Cannon walk primitives.

gloo, fp32, fresh random inputs, N=13 (divisible by no grid axis) with masked real tokens and
random garbage in the padding. Each rank computes the cp=1 reference itself (serial layout) and
compares its own tile; one process spawn per grid runs every check.
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from cpbench.models.pairformer.adapter import PairformerAdapter, all_reduce_grads, trunk_loss
from cpbench.models.pairformer.ops.triangle_product import triangle_product
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import layout_from_mesh
from cpbench.models.pairformer.parallel.ring import RingWalk

from helpers.dist import run_distributed
from helpers.parity import (
    TOL,
    assert_training_losses_match,
    block_cases,
    op_case,
    record_blocks_only_grad_errors,
    record_trained_param_errors,
    record_trunk_grad_errors,
    rel_error,
)

N, N_MAX_PAD = 13, 16
C_S, C_Z, HEADS_S, HEADS_T, HEAD_DIM, FACTOR = 16, 8, 2, 2, 4, 2
TINY = dict(c_s=C_S, c_z=C_Z, blocks=2, heads_single=HEADS_S, heads_tri=HEADS_T, head_dim_tri=HEAD_DIM,
            transition_factor=FACTOR)
if "msa_blocks" in inspect.signature(PairformerAdapter).parameters:
    # The trunk here is embedder, atom encoder and Pairformer blocks; the MSA module's 2d parity
    # (alone and in the trunk) is tests/*/test_msa_2d_parity.py, which keeps this spawn short.
    TINY.update(c_atom=8, c_atompair=4, atom_blocks=1, atom_heads=2, msa_blocks=0)
LEAN_BUDGET_B = 2048  # forces multi-chunk loops (rows, channels)





CASES = block_cases(C_S, C_Z, HEADS_S, HEADS_T, HEAD_DIM, FACTOR)


def _mesh(shape: tuple[int, int]):
    return init_device_mesh("cpu", shape, mesh_dim_names=("cp0", "cp1"))


def _tile(layout, n_pad: int) -> tuple[slice, slice, slice, slice]:
    """(rows, cols) held here, and the real (unpadded) global rows / cols among them."""
    rows, cols = layout.rows(n_pad), layout.cols(n_pad)
    real_r = slice(rows.start, max(rows.start, min(rows.stop, N)))
    real_c = slice(cols.start, max(cols.start, min(cols.stop, N)))
    return rows, cols, real_r, real_c


def _row_sum(t: torch.Tensor, layout) -> torch.Tensor:
    """Sum over the grid row: the gradient of a replicated ``s`` is split among its replicas."""
    t = t.clone()
    dist.all_reduce(t, group=layout.grid.row_group)
    return t


def _check_case(name: str, seed: int, layout, errors: dict) -> None:
    n_pad = -(-N // layout.units) * layout.units
    case = op_case(CASES, name, seed, N, N_MAX_PAD, C_S, C_Z)
    z, wz, s, ws, mask, mod, wrap = case.z, case.wz, case.s, case.ws, case.mask, case.mod, CASES[name][1]
    s_out, z_out = case.s_out, case.z_out

    rows, cols, rr, rc = _tile(layout, n_pad)
    kr, kc = rr.stop - rr.start, rc.stop - rc.start
    z_loc = z[rows, cols].clone().requires_grad_()
    s_loc = s[rows].clone().requires_grad_()
    s_weight = 1.0 if layout.owns_single else 0.0  # s is replicated over the grid row: count it once
    with chunking.override_budget(LEAN_BUDGET_B):  # row-chunked autograd paths (one walk per chunk)
        s_out_l, z_out_l = wrap(mod)(s_loc, z_loc, mask[:n_pad], layout)
        ((z_out_l[:kr, :kc] * wz[rr, rc]).sum() + s_weight * (s_out_l[:kr] * ws[rr]).sum()).backward()
    all_reduce_grads(mod, layout)

    errors[f"{name}/z"] = rel_error(z_out_l[:kr, :kc], z_out[rr, rc])
    errors[f"{name}/s"] = rel_error(s_out_l[:kr], s_out[rr])
    errors[f"{name}/grad_z"] = rel_error(z_loc.grad[:kr, :kc], case.z_ref.grad[rr, rc])
    errors[f"{name}/grad_s"] = rel_error(_row_sum(s_loc.grad, layout)[:kr], case.s_ref.grad[rr])
    for (pname, p), p_ref in zip(mod.named_parameters(), case.ref.parameters()):
        errors[f"{name}/grad/{pname}"] = rel_error(p.grad, p_ref.grad)

    with torch.no_grad(), chunking.override_budget(LEAN_BUDGET_B):
        s_lean, z_lean = wrap(mod)(s[rows].clone(), z[rows, cols].clone(), mask[:n_pad], layout)
    errors[f"{name}/lean_z"] = rel_error(z_lean[:kr, :kc], z_out[rr, rc])
    errors[f"{name}/lean_s"] = rel_error(s_lean[:kr], s_out[rr])


def _check_trunk_and_training(seed: int, shape: tuple[int, int], errors: dict, losses: dict, stats: dict) -> None:
    mesh = _mesh(shape)
    cpu = torch.device("cpu")
    sharded = PairformerAdapter(**TINY, dtype="fp32", recycles=1, checkpointing=True, lr=1e-3)
    serial = PairformerAdapter(**TINY, dtype="fp32", recycles=1, checkpointing=False, lr=1e-3)
    built = {}
    for key, adapter, m in (("ref", serial, None), ("cp", sharded, mesh)):
        torch.manual_seed(seed)
        model = adapter.build_model(m, cpu)
        torch.manual_seed(seed + 1)
        built[key] = (model, adapter.build_batch(N, 8 * N, 4, m, cpu))
    (ref, ref_batch), (mod, batch) = built["ref"], built["cp"]
    layout = mod.layout
    rows, cols, rr, rc = _tile(layout, batch["token_mask"].shape[0])
    kr, kc = rr.stop - rr.start, rc.stop - rc.start

    s_ref, z_ref = ref(ref_batch, ref.layout, recycles=1)
    trunk_loss(s_ref, z_ref, ref_batch["token_mask"], ref.layout).backward()
    s_cp, z_cp = mod(batch, layout, recycles=1, checkpointing=True)
    trunk_loss(s_cp, z_cp, batch["token_mask"], layout).backward()
    all_reduce_grads(mod, layout)
    errors["trunk/z"] = rel_error(z_cp[:kr, :kc], z_ref[rr, rc])
    errors["trunk/s"] = rel_error(s_cp[:kr], s_ref[rr])
    record_trunk_grad_errors(errors, mod, ref)
    mod.zero_grad(set_to_none=True)
    record_blocks_only_grad_errors(errors, mod, ref, batch, layout)
    ref.zero_grad(set_to_none=True)

    with torch.no_grad(), chunking.override_budget(LEAN_BUDGET_B):
        s_lean, z_lean = mod(batch, layout, recycles=1)
    errors["trunk/lean_z"] = rel_error(z_lean[:kr, :kc], z_ref[rr, rc])
    errors["trunk/lean_s"] = rel_error(s_lean[:kr], s_ref[rr])

    sharded.run_step(mod, batch, train=False)
    stats.update(sharded.stats())
    for key, adapter in (("ref", serial), ("cp", sharded)):
        model, b = built[key]
        losses[key] = [float(adapter.run_step(model, b, train=True)) for _ in range(3)]
    record_trained_param_errors(errors, mod, ref)


def _cannon_bytes(layout) -> tuple[int, int]:
    """(counted, documented) bytes this rank sends in one no-grad 2d triangle product on a square
    grid: grid transpose of one operand (off-diagonal ranks), the A and B skews (a, b != 0) and
    q - 1 shifts of each, one operand tile ``T`` each."""
    q, a, b = layout.grid.cp1, layout.grid.a, layout.grid.b
    left, right = torch.randn(2, C_Z, 5, 5)
    tile_b = left.numel() * left.element_size()
    before = comm.BYTES.sent_b
    with torch.no_grad():
        triangle_product(left, right, layout)
    return comm.BYTES.sent_b - before, tile_b * (int(a != b) + int(a != 0) + int(b != 0) + 2 * (q - 1))


def _parity_worker(rank: int, world: int, seed: int, shape: tuple[int, int], cases: tuple[str, ...]) -> dict:
    layout = layout_from_mesh(_mesh(shape))
    walk = _walk_pieces(layout)
    cannon_bytes = _cannon_bytes(layout) if shape[0] == shape[1] else None
    errors: dict[str, float] = {}
    for i, name in enumerate(cases):
        _check_case(name, seed + i, layout, errors)
    losses: dict[str, list[float]] = {}
    stats: dict = {}
    _check_trunk_and_training(seed, shape, errors, losses, stats)
    return {"errors": errors, "losses": losses, "stats": stats, "grid": (layout.grid.a, layout.grid.b), "walk": walk,
            "cannon_bytes": cannon_bytes}


def _assert_parity(results: list[dict], seed: int, shape: tuple[int, int], n_min_checks: int) -> None:
    for rank, res in enumerate(results):
        _assert_walk(res["walk"], shape)
        if res["cannon_bytes"] is not None:
            counted, documented = res["cannon_bytes"]
            assert counted == documented > 0, (rank, res["grid"], counted, documented)
        bad = {k: v for k, v in res["errors"].items() if not v < TOL}
        assert not bad, f"seed {seed} rank {rank} grid {res['grid']}: relative errors above {TOL}: {bad}"
        ref, cp_losses = res["losses"]["ref"], res["losses"]["cp"]
        assert_training_losses_match(cp_losses, ref, (seed, rank))
        assert cp_losses == results[0]["losses"]["cp"], "training loss differs between ranks"
        assert res["stats"]["comm_bytes_per_block"] > 0  # the 2d ops count what they send
    assert len(results[0]["errors"]) > n_min_checks  # every op, block, trunk, parameter was compared


@pytest.mark.parametrize("shape", [(2, 2), (1, 2), (2, 1)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_cp2d_matches_cp1_for_ops_block_trunk_and_three_training_steps(shape):
    seed = int.from_bytes(os.urandom(4), "little")
    results = run_distributed(_parity_worker, shape[0] * shape[1], args=(seed, shape, tuple(CASES)), timeout_s=300)
    _assert_parity(results, seed, shape, 100)


def test_cp2d_2x4_grid_matches_cp1_for_block_and_trunk():
    """8 processes on a 2-core CI machine: the block (all of its ops) and the trunk only."""
    seed = int.from_bytes(os.urandom(4), "little")
    results = run_distributed(_parity_worker, 8, args=(seed, (2, 4), ("block",)), timeout_s=300)
    _assert_parity(results, seed, (2, 4), 50)


def _walk_pieces(layout) -> dict:
    """Every piece of this rank's walk as (A tile's k tokens, B tile's k tokens, the piece's k),
    and the accumulators that came home (each use of a tile element adds 1)."""
    n_pad = 4 * layout.units
    walk = RingWalk(layout.grid, n_pad)
    seen = []
    tok = torch.arange(n_pad, dtype=torch.float32)
    # The A tile carries its k tokens (columns), the B tile its k tokens (rows).
    a_tile, b_tile = tok[layout.cols(n_pad)].clone(), tok[layout.rows(n_pad)].clone()

    def step(a_t, b_t, pc, a_acc, b_acc):
        seen.append((a_t[pc.ka].tolist(), b_t[pc.kb].tolist(), list(range(pc.k.start, pc.k.stop))))
        a_acc[pc.ka] += 1
        b_acc[pc.kb] += 1

    acc_a, acc_b = walk.run(a_tile, b_tile, step, torch.zeros_like(a_tile), torch.zeros_like(b_tile))
    return {"seen": seen, "acc_a": acc_a.tolist(), "acc_b": acc_b.tolist(), "n_pad": n_pad}


def _assert_walk(res: dict, shape: tuple[int, int]) -> None:
    covered = sorted(k for _, _, ks in res["seen"] for k in ks)
    assert covered == list(range(res["n_pad"]))  # every k exactly once
    for a_k, b_k, ks in res["seen"]:
        assert a_k == b_k == [float(x) for x in ks]  # both tiles hold the piece's k
    # Every rank of the grid row used each A element once (of the column, each B element): the
    # travelling accumulators came home with every contribution.
    assert res["acc_a"] == [float(shape[1])] * len(res["acc_a"])
    assert res["acc_b"] == [float(shape[0])] * len(res["acc_b"])


def _walk_worker(rank: int, world: int, shape: tuple[int, int]) -> dict:
    return _walk_pieces(layout_from_mesh(_mesh(shape)))


def test_cannon_walk_on_a_2x3_grid_covers_every_k_once_and_returns_accumulators():
    """Neither grid axis divides the other: both walks start inside a block."""
    for res in run_distributed(_walk_worker, 6, args=((2, 3),), timeout_s=120):
        _assert_walk(res, (2, 3))
