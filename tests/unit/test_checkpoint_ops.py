"""``model.checkpoint_ops``: with ``workflow.checkpointing``, the trunk checkpoints each block and,
by default, each op inside the block's recompute. ``false`` checkpoints the blocks only: the same
loss and gradients (on fresh random inputs), each op's forward once less a step, and the FLOP
count's recompute one pass instead of ``RECOMPUTE_PASSES``."""

from __future__ import annotations

import pytest
import torch

from cpbench.models.pairformer import flops
from cpbench.models.pairformer.adapter import PairformerAdapter, trunk_loss
from cpbench.models.pairformer.layers.transition import Transition

SIZES = dict(c_s=16, c_z=8, blocks=2, heads_single=2, heads_tri=2, head_dim_tri=4, transition_factor=2,
             dtype="fp32", c_atom=8, c_atompair=4, atom_blocks=1, atom_heads=2, c_m=8, msa_blocks=1,
             checkpointing=True)


def _step(checkpoint_ops: bool, seed: int) -> tuple[float, dict[str, torch.Tensor], int]:
    """One forward and backward of a tiny trunk (the same weights and a fresh batch per ``seed``):
    the loss, every parameter's gradient, and how many times the Pairformer blocks' pair transitions
    ran their forward (the op runner checkpoints them; the MSA block's and the single transitions
    run once per pass of their block either way)."""
    adapter = PairformerAdapter(**SIZES, checkpoint_ops=checkpoint_ops)
    torch.manual_seed(0)
    model = adapter.build_model(None, torch.device("cpu"))
    torch.manual_seed(seed)
    batch = adapter.build_batch(20, 60, 4, None, torch.device("cpu"))
    calls = []
    hooks = [m.register_forward_pre_hook(lambda *_: calls.append(1)) for name, m in model.named_modules()
             if isinstance(m, Transition) and name.startswith("blocks.") and name.endswith(".pair_transition")]
    s, z = model(batch, model.layout, checkpointing=True, checkpoint_ops=checkpoint_ops)
    loss = trunk_loss(s, z, batch["token_mask"], model.layout)
    loss.backward()
    loss = loss.detach()
    for hook in hooks:
        hook.remove()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return float(loss), grads, len(calls)


@pytest.mark.parametrize("seed", [1, 2])
def test_blocks_only_checkpointing_gives_the_same_gradients(seed):
    loss_nested, grads_nested, calls_nested = _step(True, seed)
    loss_blocks, grads_blocks, calls_blocks = _step(False, seed)
    assert loss_blocks == pytest.approx(loss_nested, rel=1e-6)
    assert grads_blocks.keys() == grads_nested.keys() and len(grads_nested) > 20
    for name, grad in grads_nested.items():
        torch.testing.assert_close(grads_blocks[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    # each block's pair transition: the forward, the block's recompute and (nested) the op's own
    assert (calls_nested, calls_blocks) == (3 * SIZES["blocks"], 2 * SIZES["blocks"])


def test_flop_count_recomputes_one_pass_with_the_blocks_only():
    sizes = flops.PairformerSizes(blocks=4)
    forward = 4 * flops.block_flops(512, sizes)["block"]
    nested = flops.step_flops(512, sizes, train=True, checkpointing=True)
    blocks = flops.step_flops(512, sizes, train=True, checkpointing=True, checkpoint_ops=False)
    assert blocks["step"] == nested["step"] == pytest.approx(3 * forward)  # MFU counts no recompute
    assert blocks["hardware"] == pytest.approx(4 * forward)
    assert nested["hardware"] == pytest.approx((3 + flops.RECOMPUTE_PASSES) * forward)
    assert "the blocks" in blocks["basis"] and "nested" in nested["basis"]


def test_checkpoint_ops_is_a_boolean():
    from cpbench.config import ConfigError, resolve_point

    from helpers.run import compose_cfg

    with pytest.raises(ConfigError, match=r"^model\.checkpoint_ops=yes: true or false$"):
        resolve_point(compose_cfg("device=cpu", "model=tiny", "model.checkpoint_ops=yes"))


def test_report_labels_a_blocks_only_training_point_apart():
    """A ``model.checkpoint_ops=false`` training point holds more memory and recomputes less than
    the default's: its rows and curves are their own series, even where the backend column is."""
    from cpbench.report.rows import model_label, without_training_path

    def record(checkpoint_ops, workflow="training"):
        return {"point": {"workflow": workflow, "device": "cuda",
                          "model": {"name": "boltz2", "kernels": "auto", "compile_training": True,
                                    "checkpoint_ops": checkpoint_ops}}}

    assert model_label(record(True)) == "boltz2 [model.compile_training=true]"
    blocks_only = model_label(record(False))
    assert blocks_only == "boltz2 [model.compile_training=true model.checkpoint_ops=false]"
    assert without_training_path(blocks_only) == "boltz2 [model.checkpoint_ops=false]"
    assert model_label(record(False, "inference")) == "boltz2"  # no checkpoints in inference
