"""The MSA module (AF3 Alg. 8 / Boltz-2): ``blocks`` x [outer product mean into z, pair-weighted
averaging, MSA transition, triangle updates and pair transition of z].

Per rank (1d, ``P`` ranks, ``n = N/P``): the MSA is sharded along tokens, ``m: [S, N/P, c_m]``
(the columns of this rank's z rows), ``z: [N/P, N, c_z]`` (rows). Collectives per block:

* outer product mean (``msa_ops.py``): ``z_ij += W·flatten(Σ_s a_si ⊗ b_sj) / Σ_s mask_si mask_sj``
  needs ``b`` (and the mask) of every column j: all-gathered along tokens, without autograd in
  chunks of S and of columns, ``(P-1)·S·N/P·(c_opm+1)`` elements sent per rank.
* pair-weighted averaging (``msa_ops.py``): the weights ``softmax_j(W LN(z_ij))`` come from the
  local z rows (no pair traffic); the values ``v_sj`` of every column j are all-gathered, in
  chunks likewise, ``(P-1)·S·N/P·heads·head_dim`` elements sent per rank.
* the pair updates: as in a Pairformer block (``block.py``), four all-to-alls of z and the
  gathers of the triangle ops.

2d (``cp0 x cp1`` grid, ``msa_ops.py``): ``m: [S, N/cp0, c_m]`` holds the MSA columns of the
tile rows ``R_a``, replicated over the grid row (like ``s``), ``z: [N/cp0, N/cp1, c_z]``. Per
block the outer product mean and pair-weighted averaging gather ``b`` / ``v`` of the tile
columns along the grid column (``(cp0-1)·S·N/cp0·(c_opm+1)`` resp. ``·heads·head_dim``
elements), and the averaging all-reduces its partial sums along the grid row
(``2(cp1-1)/cp1·S·N/cp0·heads·head_dim``); the MSA transition is local (run by each replica);
the pair updates are the grid ops of ``cp2d.py``.

No row attention over ``S x N²``. Without autograd, m and z are updated in place and every
transient is chunked to the budget of ``chunking.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.data.vocab import NUM_RESTYPES
from cpbench.models.pairformer.layers.msa_ops import OuterProductMean, PairWeightedAveraging
from cpbench.models.pairformer.layers.transition import Transition
from cpbench.models.pairformer.layers.triatt import TriangleAttention
from cpbench.models.pairformer.layers.trimul import TriangleMultiplication
from cpbench.models.pairformer.modules.block import agreed_chunks, op_runner, pair_updates, run_block
from cpbench.models.pairformer.parallel.layout import Layout

N_MSA_FEATS = NUM_RESTYPES + 2  # one-hot residue class, has_deletion, deletion_value


class MsaBlock(nn.Module):
    """One MSA module block. ``forward(m, z, msa_mask, token_mask, layout) -> (m, z)`` with
    ``m: [S, N/P, c_m]``, ``z: [N/P, N, c_z]``, ``msa_mask: [S, N/P]``, ``token_mask: [N]``.

    ``msa_updates=False`` (the last block) leaves m alone: only z leaves the module, and m's
    updates after the last outer product mean would be dead work (and dead parameters)."""

    def __init__(self, c_m: int, c_z: int, c_opm: int, heads_pwa: int, head_dim_pwa: int, heads_tri: int,
                 head_dim_tri: int, transition_factor: int, msa_updates: bool = True) -> None:
        super().__init__()
        self.outer_product_mean = OuterProductMean(c_m, c_z, c_opm)
        self.msa_updates = msa_updates
        if msa_updates:
            self.pair_weighted_averaging = PairWeightedAveraging(c_m, c_z, heads_pwa, head_dim_pwa)
            self.msa_transition = Transition(c_m, transition_factor)
        self.tri_mul_out = TriangleMultiplication(c_z, incoming=False)
        self.tri_mul_in = TriangleMultiplication(c_z, incoming=True)
        self.tri_att_start = TriangleAttention(c_z, heads_tri, head_dim_tri, ending=False)
        self.tri_att_end = TriangleAttention(c_z, heads_tri, head_dim_tri, ending=True)
        self.pair_transition = Transition(c_z, transition_factor)

    def forward(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor, token_mask: torch.Tensor,
                layout: Layout, checkpoint_ops: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``checkpoint_ops``: checkpoint each op, as ``PairformerBlock`` does (``block.op_runner``)."""
        run = op_runner(z, layout, checkpoint_ops)
        with agreed_chunks(z, layout):
            z = run(self.outer_product_mean, m, z, msa_mask, layout)
            if self.msa_updates:
                m = run(self.pair_weighted_averaging, m, z, token_mask, layout)
                m = run(self.msa_transition, m)
            z = pair_updates(self, z, token_mask, layout, run)  # a Pairformer block's, in AF3's order
        return m, z


class MsaModule(nn.Module):
    """``forward(feats, s_inputs, z, layout) -> z`` (AF3 Alg. 8 without the MSA subsampling).

    Args of forward:
        feats: ``msa``, ``has_deletion``, ``deletion_value``, ``msa_mask``: ``[S, N/P]`` (this
            rank's columns, ``layout.rows``: in 2d the tile rows ``R_a``, ``[S, N/cp0]``; the
            global ``[S, N]`` is sliced here), ``token_mask: [N]``.
        s_inputs: ``[N, c_s]`` (global, every rank).
        z: ``[N/P, N, c_z]`` (2d: ``[N/cp0, N/cp1, c_z]``); updated in place without autograd.
    """

    def __init__(self, c_m: int, c_z: int, c_s: int, blocks: int, heads_tri: int, head_dim_tri: int,
                 transition_factor: int, c_opm: int = 32, heads_pwa: int = 8, head_dim_pwa: int = 32) -> None:
        super().__init__()
        self.msa_embed = nn.Linear(N_MSA_FEATS, c_m, bias=False)
        self.single_embed = nn.Linear(c_s, c_m, bias=False)
        self.blocks = nn.ModuleList(
            MsaBlock(c_m, c_z, c_opm, heads_pwa, head_dim_pwa, heads_tri, head_dim_tri, transition_factor,
                     msa_updates=i < blocks - 1)
            for i in range(blocks))

    def embed(self, feats: dict[str, torch.Tensor], s_inputs: torch.Tensor, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """``m: [S, N/P, c_m]`` and ``msa_mask: [S, N/P]`` of this rank's columns."""
        rows = layout.rows(feats["token_mask"].shape[0])
        cols = slice(None) if feats["msa"].shape[1] == rows.stop - rows.start else rows

        def local(key: str) -> torch.Tensor:
            return feats[key][:, cols]

        w = self.msa_embed.weight
        # one-hot(msa) @ W as a row lookup; the two deletion channels as a dense [S, n, 2] product
        m = F.embedding(local("msa"), w[:, :NUM_RESTYPES].t())
        dele = torch.stack([local("has_deletion").to(w.dtype), local("deletion_value").to(w.dtype)], dim=-1)
        m = m + F.linear(dele, w[:, NUM_RESTYPES:])
        return m + self.single_embed(s_inputs[rows]), local("msa_mask")

    def forward(self, feats: dict[str, torch.Tensor], s_inputs: torch.Tensor, z: torch.Tensor,
                layout: Layout, run_blocks: int | None = None, checkpointing: bool = False,
                checkpoint_ops: bool = True) -> torch.Tensor:
        """``run_blocks``: run only the first ``run_blocks`` blocks (the probe's depth, as in the
        trunk). ``checkpointing`` (autograd only): each block checkpointed, with ``checkpoint_ops``
        its ops nested inside (as the trunk's blocks), so training keeps only the block inputs ``m``
        and ``z``."""
        token_mask = feats["token_mask"]
        m, msa_mask = self.embed(feats, s_inputs, layout)
        for block in self.blocks[:run_blocks]:
            m, z = run_block(block, m, z, msa_mask, token_mask, layout, checkpointing=checkpointing,
                             checkpoint_ops=checkpoint_ops)
        return z
