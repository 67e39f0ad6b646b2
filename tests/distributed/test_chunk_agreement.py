"""An inference block agrees its chunk sizes once, not op by op, and still matches cp=1.

Each agreement (``comm.agree_min``) is an all-reduce and a host sync; a 1d block used to run
eight (four transposes, two triangle multiplications, their two gathered products). Now:

* CPU budgets are functions of the shard shapes: no agreement at all;
* on a GPU away from the limit (``chunking.ample_budget`` > 0 on every rank, simulated here) one
  agreement per block, and every op chunks by the agreed budget;
* near the limit (``ample_budget`` 0 on some rank) each op agrees its own, as before.

gloo, cp=2, fp32, fresh random inputs, N=13 (padded to 14), a budget small enough that every op
loops over several chunks (but in the simulated "ample" case: ``AMPLE_BUDGET_B``). Each rank
compares its shard of the block's output with the serial block's and counts the all-reduces the
block ran (its data collectives in 1d are all-to-alls and all-gathers, so every all-reduce is an
agreement). Both the Pairformer block and the MSA module's block.
"""

from __future__ import annotations

import contextlib
import random
from typing import Iterator

import pytest
import torch
import torch.distributed as dist

from cpbench.models.pairformer.modules.block import PairformerBlock
from cpbench.models.pairformer.modules.msa_module import MsaBlock
from cpbench.models.pairformer.parallel import chunking
from cpbench.models.pairformer.parallel.layout import layout_1d, serial_layout

from helpers.dist import run_distributed
from helpers.parity import rel_error

N, N_PAD = 13, 14
C_S, C_Z, C_M, S_MSA = 16, 8, 8, 5
SMALL_BUDGET_B = 2048  # every op in several chunks
# A simulated free-memory budget carries the chunk floor (at least four rows of every op per
# chunk), so the agreed budget of the "ample" case is larger: its ops run whole; the loops
# inside an agreed block are the "cpu" case's.
AMPLE_BUDGET_B = 64 << 10
AGREEMENTS_PER_OP = 8  # 1d block, each op agreeing its own (near the limit)


@contextlib.contextmanager
def _counted_all_reduces() -> Iterator[list[int]]:
    """``[n]``: the ``dist.all_reduce`` calls made inside the context (``comm`` looks it up at call time)."""
    calls, real = [0], dist.all_reduce

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    dist.all_reduce = counting
    try:
        yield calls
    finally:
        dist.all_reduce = real


def _run(rank: int, world: int, mode: str, which: str, seed: int) -> dict:
    """The block at cp=2 under ``mode``: ``cpu`` (shape budgets), ``ample`` (a simulated GPU away
    from the limit) or ``near`` (a simulated GPU near it); its error against serial and the
    all-reduces it ran."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(N_PAD, N_PAD, C_Z, generator=g)
    s = torch.randn(N_PAD, C_S, generator=g)
    m = torch.randn(S_MSA, N_PAD, C_M, generator=g)
    token_mask = torch.rand(N_PAD, generator=g) > 0.3
    token_mask[0], token_mask[N:] = True, False
    msa_mask = torch.ones(S_MSA, N_PAD)
    torch.manual_seed(seed)
    if which == "block":
        block = PairformerBlock(C_S, C_Z, heads_single=2, heads_tri=2, head_dim_tri=4, transition_factor=2)
    else:
        block = MsaBlock(C_M, C_Z, heads_tri=2, head_dim_tri=4, transition_factor=2, c_opm=4, heads_pwa=2,
                         head_dim_pwa=4, msa_updates=True)
    layout = layout_1d()
    rows = layout.rows(N_PAD)

    def forward(lay, z_in, other):
        if which == "block":
            return block(other, z_in, token_mask, lay)[1]
        return block(other, z_in, msa_mask[:, rows] if lay.sharded else msa_mask, token_mask, lay)[1]

    with torch.no_grad():
        with chunking.override_budget(SMALL_BUDGET_B):
            z_ref = forward(serial_layout(), z.clone(), s.clone() if which == "block" else m.clone())
        other = s[rows].clone() if which == "block" else m[:, rows].clone()
        context: contextlib.AbstractContextManager = chunking.override_budget(SMALL_BUDGET_B)
        if mode != "cpu":  # simulate CUDA budgets: free-memory readings the ranks must agree on
            chunking.budgets_from_shapes = lambda pair: False
            if mode == "ample":
                chunking.ample_budget = lambda pair: chunking.FreeMemoryBudget(AMPLE_BUDGET_B)
                context = contextlib.nullcontext()
            else:  # one rank near the limit is enough for the block to fall back to per-op agreement
                chunking.ample_budget = lambda pair: 0 if rank == 1 else chunking.FreeMemoryBudget(AMPLE_BUDGET_B)
        with context, _counted_all_reduces() as calls:
            z_cp = forward(layout, z[rows].clone(), other)
    return {"error": rel_error(z_cp, z_ref[rows]), "all_reduces": calls[0]}


@pytest.mark.parametrize("which", ["block", "msa_block"])
@pytest.mark.parametrize("mode, agreements", [("cpu", 0), ("ample", 1), ("near", None)])
def test_an_inference_block_agrees_its_chunks_once_and_matches_cp1(mode, agreements, which):
    results = run_distributed(_run, world_size=2, args=(mode, which, random.randrange(2**31)))
    for r in results:
        assert r["error"] < 1e-5, r
    counts = {r["all_reduces"] for r in results}
    assert len(counts) == 1, results  # the same collectives on both ranks
    count = counts.pop()
    if agreements is not None:
        assert count == agreements, results
    else:  # near the limit: the block's agreement, then each op's own, as before the change
        assert count >= 1 + AGREEMENTS_PER_OP, results
