"""The analytic FLOP count is exact for the reference block, and MFU uses the right peak."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from cpbench.models.pairformer import flops
from cpbench.models.pairformer.modules import block as block_mod
from cpbench.models.pairformer.parallel import layout as layout_mod
from cpbench.report import mfu


def _odd_sized_block():
    """Odd sizes, so that no term of the count can hide behind another."""
    sizes = flops.PairformerSizes(c_s=24, c_z=12, blocks=1, heads_single=3, heads_tri=2, head_dim_tri=5,
                                  transition_factor=3)
    block = block_mod.PairformerBlock(sizes.c_s, sizes.c_z, sizes.heads_single, sizes.heads_tri,
                                      sizes.head_dim_tri, sizes.transition_factor)
    return sizes, block


def test_block_flops_match_torch_flop_counter_on_reference_block():
    # Autograd on, so that torch counts every matmul (its no-grad CPU attention kernel is not
    # counted by FlopCounterMode).
    sizes, block = _odd_sized_block()
    n = 37
    s, z = torch.randn(n, sizes.c_s), torch.randn(n, n, sizes.c_z)
    with FlopCounterMode(display=False) as counter:
        block(s, z, torch.ones(n, dtype=torch.bool), layout_mod.serial_layout())
    assert flops.block_flops(n, sizes)["block"] == pytest.approx(counter.get_total_flops(), rel=1e-9)


def test_checkpoint_recompute_matches_flop_counter_on_reference_block():
    # The trunk checkpoints each block and, inside it, each op (checkpoint_ops=True): the
    # difference to a plain forward+backward is RECOMPUTE_PASSES forwards of the block.
    sizes, block = _odd_sized_block()
    n = 19
    mask, layout = torch.ones(n, dtype=torch.bool), layout_mod.serial_layout()
    totals = []
    for checkpointed in (False, True):
        s = torch.randn(n, sizes.c_s, requires_grad=True)
        z = torch.randn(n, n, sizes.c_z, requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            if checkpointed:
                s_out, z_out = checkpoint(block, s, z, mask, layout, True, use_reentrant=False)
            else:
                s_out, z_out = block(s, z, mask, layout)
            (s_out.sum() + z_out.sum()).backward()
        totals.append(counter.get_total_flops())
    per_op = flops.block_flops(n, sizes)
    recompute = (totals[1] - totals[0]) / per_op["block"]
    # The transitions checkpoint their row chunks even without block checkpointing, so part of
    # their recompute is in both runs: the difference is RECOMPUTE_PASSES forwards, less up to
    # the transitions' share.
    transitions = (per_op["pair_transition"] + per_op["single_transition"]) / per_op["block"]
    assert flops.RECOMPUTE_PASSES - transitions - 0.02 <= recompute <= flops.RECOMPUTE_PASSES + 0.02


def test_block_flops_are_the_sum_of_the_ops_and_cubic_in_n():
    sizes = flops.PairformerSizes()
    small, large = flops.block_flops(4096, sizes), flops.block_flops(8192, sizes)
    assert small["block"] == pytest.approx(sum(small[op] for op in flops.BLOCK_OPS))
    # The triangle ops are O(N^3): doubling N multiplies the block by nearly 8 at Boltz-2 sizes.
    assert 7.0 < large["block"] / small["block"] < 8.0


def test_training_step_counts_backward_and_reports_recompute_apart():
    sizes = flops.PairformerSizes(blocks=4)
    forward = 4 * flops.block_flops(512, sizes)["block"]
    plain = flops.step_flops(512, sizes, train=True, recycles=0, checkpointing=False)
    ckpt = flops.step_flops(512, sizes, train=True, recycles=1, checkpointing=True)
    infer = flops.step_flops(512, sizes, train=False, recycles=3)
    assert plain["step"] == plain["hardware"] == pytest.approx(3 * forward)
    # MFU counts model FLOPs (4x: one recycle + 3x); the hardware also runs the recomputes.
    assert ckpt["step"] == pytest.approx(4 * forward) and "recompute" in ckpt["basis"]
    assert ckpt["hardware"] == pytest.approx((4 + flops.RECOMPUTE_PASSES) * forward)
    assert infer["step"] == pytest.approx(4 * forward)


def test_mfu_peak_prefers_configured_value_then_measured_h200_table():
    assert mfu.peak_tflops("NVIDIA H200", "bf16", configured=500.0)[0] == 500.0
    value, source = mfu.peak_tflops("NVIDIA H200", "bf16")
    assert value == 774.0 and "measured" in source
    assert mfu.peak_tflops("NVIDIA H200", "fp32")[0] is None
    assert mfu.peak_tflops(None, "bf16")[0] is None
    assert mfu.achieved_tflops_per_gpu(2e12, 1000.0, 2) == pytest.approx(1.0)


def test_only_the_reference_trunk_gets_an_analytic_count():
    assert flops.is_reference_trunk({"name": "tiny", "_target_": flops.PAIRFORMER_TARGET})
    assert not flops.is_reference_trunk({"name": "adapter", "_target_": "mypkg.Model"})
    assert not flops.is_reference_trunk(None)
