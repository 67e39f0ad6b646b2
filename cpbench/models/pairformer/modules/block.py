"""One Pairformer block (AF3 Algorithm 17), in AF3's order, over any layout.

Per block in 1d: four all-to-alls of z (``transpose.transpose_pair``: rows -> Z^T rows before the
incoming triangle multiplication, back before the starting-node attention, again before the
ending-node attention, back after the pair transition), two chunked all-gathers of a triangle
operand, two all-gathers of a triangle bias, and the single attention's key/value all-gather.
Per rank that is about ``4·(P-1)/P·|z_local| + 2·(P-1)·|z_local| + 2·(P-1)/P·N²·heads_tri``
elements: O(N²·c_z) whatever P (the 2d layout cuts it to O(N²·c_z/√P)).
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cpbench.models.pairformer.layers.single_att import AttentionPairBias
from cpbench.models.pairformer.layers.transition import Transition
from cpbench.models.pairformer.layers.triatt import TriangleAttention
from cpbench.models.pairformer.layers.trimul import TriangleMultiplication
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import Layout
from cpbench.models.pairformer.parallel.transpose import transpose_pair


def op_runner(z: torch.Tensor, layout: Layout, checkpoint_ops: bool) -> Callable[..., Any]:
    """``run(op, *args)``: calls ``op(*args)``, checkpointed when ``checkpoint_ops`` and autograd
    is on, so that a checkpointed block's recompute holds one op's activations at a time. The
    ops chunk by the training budget (``chunking.training_budget_bytes``: room left for the
    block's backward): it is agreed over the ranks once and frozen for the recompute (``z``:
    this rank's pair shard, which the budget is measured against). Without autograd a block's
    chunks are agreed by ``agreed_chunks``."""
    if not (checkpoint_ops and torch.is_grad_enabled()):
        return lambda op, *args: op(*args)
    frozen = partial(chunking.frozen_budget, comm.agree_min(chunking.training_budget_bytes(z), layout, z))
    return lambda op, *args: checkpoint(op, *args, use_reentrant=False, context_fn=frozen)


def agreed_chunks(z: torch.Tensor, layout: Layout) -> contextlib.AbstractContextManager:
    """The context a block runs in: without autograd, its ops' and transposes' chunk sizes are
    agreed once for the block, not one by one (with autograd, ``op_runner`` agrees them).

    On a CPU every budget is a function of the shard shapes, the same on every rank, so nothing
    is agreed (``comm.agreed``). On a GPU away from the limit every op would read the same device
    term (``chunking.ample_budget``): the block reads it once, agrees it in one all-reduce
    (instead of the eight of a 1d block, each a host sync, and a free-memory reading per op) and
    hands it to the ops, whose chunks are then those they would have chosen. Near the limit,
    where what each op leaves free decides its chunks, each op reads and agrees its own.
    ``z``: this rank's pair shard."""
    return chunk_context(z, layout)()


def chunk_context(z: torch.Tensor, layout: Layout) -> Callable[[], contextlib.AbstractContextManager]:
    """``agreed_chunks``'s decision, made once (at most one agreement), as a factory of its
    context: for callers that enter it op by op (``scripts/profile_ops.py`` times each op of a
    block under the one agreement the block makes)."""
    if torch.is_grad_enabled():
        return contextlib.nullcontext
    if chunking.budgets_from_shapes(z):
        return comm.agreed
    budget_b = comm.agree_min(chunking.ample_budget(z), layout, z)
    return partial(under_budget, chunking.FreeMemoryBudget(budget_b)) if budget_b else contextlib.nullcontext


@contextlib.contextmanager
def under_budget(budget_b: int) -> Iterator[None]:
    """Every op inside reads ``budget_b`` and agrees nothing (every rank holds the same): a
    block's agreed budget, and the frozen budget of a captured block loop (``cuda_graphs``)."""
    with chunking.override_budget(budget_b), comm.agreed():
        yield


def pair_updates(ops: nn.Module, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout,
                 run: Callable[..., Any]) -> torch.Tensor:
    """The pair updates of a Pairformer block in AF3's order, on ``ops``'s ``tri_mul_out``,
    ``tri_mul_in``, ``tri_att_start``, ``tri_att_end`` and ``pair_transition`` (a block's, or an
    MSA block's); ``z: [N/P, N, c_z]`` rows of Z in and out. ``z`` is rebound to each transpose's
    result before the next op runs, so that no op runs while the pre-transpose shard is still
    referenced here (``transpose_pair``'s result may be a new buffer)."""
    z = run(ops.tri_mul_out, z, token_mask, layout)
    z = transpose_pair(z, layout)  # Z^T rows
    z = run(ops.tri_mul_in, z, token_mask, layout)
    z = transpose_pair(z, layout)  # Z rows
    z = run(ops.tri_att_start, z, token_mask, layout)
    z = transpose_pair(z, layout)  # Z^T rows
    z = run(ops.tri_att_end, z, token_mask, layout)
    z = run(ops.pair_transition, z)
    return transpose_pair(z, layout)  # back to Z rows


def run_block(block: nn.Module, *args, checkpointing: bool = False, checkpoint_ops: bool = True) -> Any:
    """``block(*args)``; with ``checkpointing`` and autograd on, checkpointed, so training keeps only
    the block's inputs, and with ``checkpoint_ops`` each op checkpointed inside the block's recompute
    (backward then holds one op's activations, and each op's forward runs three times a step; without
    it one block's activations, and twice). Used by the trunk for its Pairformer blocks and by the
    MSA module for its blocks."""
    if checkpointing and torch.is_grad_enabled():
        return checkpoint(block, *args, checkpoint_ops, use_reentrant=False)
    return block(*args)


class PairformerBlock(nn.Module):
    """``forward(s, z, token_mask, layout) -> (s, z)`` with ``s: [N/P, c_s]``,
    ``z: [N/P, N, c_z]`` (row shard of Z), ``token_mask: [N]``; in place without autograd."""

    def __init__(self, c_s: int, c_z: int, heads_single: int, heads_tri: int, head_dim_tri: int,
                 transition_factor: int) -> None:
        super().__init__()
        self.tri_mul_out = TriangleMultiplication(c_z, incoming=False)
        self.tri_mul_in = TriangleMultiplication(c_z, incoming=True)
        self.tri_att_start = TriangleAttention(c_z, heads_tri, head_dim_tri, ending=False)
        self.tri_att_end = TriangleAttention(c_z, heads_tri, head_dim_tri, ending=True)
        self.pair_transition = Transition(c_z, transition_factor)
        self.attention = AttentionPairBias(c_s, c_z, heads_single)
        self.single_transition = Transition(c_s, transition_factor)

    def forward(self, s: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout,
                checkpoint_ops: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``checkpoint_ops``: checkpoint each op (with autograd), so that the recompute of a
        checkpointed block holds one op's activations at a time, not the whole block's."""
        run = op_runner(z, layout, checkpoint_ops)
        with agreed_chunks(z, layout):
            z = pair_updates(self, z, token_mask, layout, run)
            s = run(self.attention, s, z, token_mask, layout)
            s = run(self.single_transition, s)
        return s, z
