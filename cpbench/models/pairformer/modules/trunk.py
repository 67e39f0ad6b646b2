"""The Pairformer trunk: input embedding, recycling, ``blocks`` Pairformer blocks (AF3 Alg. 1).

Per rank (layout ``layout.py``): ``s: [N/P, c_s]``, ``z: [N/P, N, c_z]`` in the weights' dtype.
Recycling (AF3): ``s = s_init + W LN(s_prev)``, ``z = z_init + W LN(z_prev)``; only the last
cycle records autograd. Without autograd the pair init is recomputed row chunk by row chunk into
the one pair buffer (no separate ``z_init`` lives beside ``z``).
"""

from __future__ import annotations

import torch
from torch import nn

from cpbench.models.pairformer.layers.embed import InputEmbedder
from cpbench.models.pairformer.modules.atom_encoder import AtomAttentionEncoder
from cpbench.models.pairformer.modules.block import PairformerBlock, run_block
from cpbench.models.pairformer.modules.cuda_graphs import GraphedBlocks
from cpbench.models.pairformer.modules.msa_module import MsaModule
from cpbench.models.pairformer.ops.layer_norm import LayerNorm
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import Layout
from cpbench.models.pairformer.stage_timer import Laps, StageTimer, maybe_stage


class PairformerTrunk(nn.Module):
    """``forward(feats, layout, recycles, run_blocks, checkpointing) -> (s, z)``.

    After each forward, ``block_comm_bytes`` (bytes this rank sent in each block's forward),
    ``block_comm`` (the same per collective kind, calls and bytes: ``comm.CommCounter``)
    and ``block_ms`` (each block's forward time: CUDA events, so timing a block does not drain
    the launch queue; reading it synchronises) describe the last cycle. With ``graphs``
    (``model.cuda_graphs``: a ``cuda_graphs.GraphedBlocks``) an inference pass replays its blocks
    as one CUDA graph where that applies; such a pass has no per-block times (``block_ms`` is
    empty), and its pair lives in the graph's buffer from one forward to the next.
    """

    def __init__(self, c_s: int, c_z: int, blocks: int, heads_single: int, heads_tri: int,
                 head_dim_tri: int, transition_factor: int, c_atom: int = 128, c_atompair: int = 16,
                 atom_blocks: int = 3, atom_heads: int = 4, c_m: int = 64, msa_blocks: int = 4) -> None:
        super().__init__()
        self.embedder = InputEmbedder(c_s, c_z)
        # Input embedding (AF3 Alg. 2): the atom encoder adds to s_inputs once per forward; the
        # MSA module adds to z in every recycling cycle, before the Pairformer blocks (Alg. 1).
        self.atom_encoder = AtomAttentionEncoder(c_atom, c_atompair, c_s, atom_blocks, atom_heads)
        self.msa_module = (MsaModule(c_m, c_z, c_s, msa_blocks, heads_tri, head_dim_tri, transition_factor)
                           if msa_blocks else None)
        self.recycle_norm_s = LayerNorm(c_s)
        self.recycle_s = nn.Linear(c_s, c_s, bias=False)
        self.recycle_norm_z = LayerNorm(c_z)
        self.recycle_z = nn.Linear(c_z, c_z, bias=False)
        self.blocks = nn.ModuleList(
            PairformerBlock(c_s, c_z, heads_single, heads_tri, head_dim_tri, transition_factor) for _ in range(blocks))
        self.block_comm_bytes: list[int] = []
        self.block_comm: list[dict] = []  # per block: {kind: {"calls", "bytes"}} (comm.CommCounter)
        self._block_laps: Laps | None = None
        self.graphs: GraphedBlocks | None = None  # model.cuda_graphs: the blocks as a replayed graph

    @property
    def block_ms(self) -> list[float]:
        """Each block's forward time (ms) in the last cycle of the last forward; [] before one."""
        return self._block_laps.ms() if self._block_laps is not None else []

    def _recycle(self, s_inputs: torch.Tensor, feats: dict, rows: slice, s: torch.Tensor,
                 z: torch.Tensor, cols: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """``(s_init + W LN(s), z_init + W LN(z))``; in place into ``z`` without autograd."""
        emb = self.embedder
        s = emb.single_init_rows(s_inputs, rows) + self.recycle_s(self.recycle_norm_s(s))
        if torch.is_grad_enabled():
            return s, emb.pair_init_rows(s_inputs, feats, rows, cols) + self.recycle_z(self.recycle_norm_z(z))
        n_local, n_pad, c_z = z.shape
        rc = chunking.rows_per_chunk(n_local, n_pad * 6 * c_z * z.element_size(), chunking.budget_bytes(z))
        for rs in chunking.slices(n_local, rc):
            global_rows = slice(rows.start + rs.start, rows.start + rs.stop)
            z[rs] = emb.pair_init_rows(s_inputs, feats, global_rows, cols) + self.recycle_z(self.recycle_norm_z(z[rs]))
        return s, z

    def forward(self, feats: dict[str, torch.Tensor], layout: Layout, recycles: int = 0,
                run_blocks: int | None = None, checkpointing: bool = False,
                timer: StageTimer | None = None, checkpoint_ops: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Args:
            feats: global padded token features (``embed.InputEmbedder``), ``token_mask [N]``.
            recycles: extra trunk passes before the last (no autograd).
            run_blocks: run only the first ``run_blocks`` blocks, of the MSA module too (all
                weights stay allocated).
            checkpointing: activation checkpointing (autograd only): the block inputs are kept
                (in the compute dtype; the MSA module's blocks likewise), and each op is
                checkpointed inside the block's recompute, so backward holds one op's
                activations at a time (``checkpoint_ops=False``: the blocks only, so backward
                holds one block's activations and each op's forward runs once less a step).
            timer: times the input embedding (``s_inputs`` and each cycle's pair init) as its
                ``embedding`` stage and the MSA module as its ``msa`` stage.
        Returns:
            ``s: [N/P, c_s]``, ``z: [N/P, N, c_z]``. ``self.s_inputs`` (``[N, c_s]``, detached)
            keeps the token features for the diffusion module's conditioning.
        """
        token_mask = feats["token_mask"]
        n_pad = token_mask.shape[0]
        rows, cols = layout.rows(n_pad), layout.cols(n_pad)  # 2d: a tile of columns
        dtype = self.recycle_z.weight.dtype
        grad = torch.is_grad_enabled()
        with maybe_stage(timer, "embedding"):
            s_inputs = self.embedder.single_inputs(feats) + self.atom_encoder(feats, layout.single_axis())
        self.s_inputs = s_inputs.detach()
        s = s_inputs.new_zeros((rows.stop - rows.start, s_inputs.shape[1]))
        pair_shape = (rows.stop - rows.start, cols.stop - cols.start, self.recycle_z.in_features)
        z = (self.graphs.pair_buffer(pair_shape, s_inputs, dtype) if self.graphs is not None
             else s_inputs.new_zeros(pair_shape, dtype=dtype))
        blocks = self.blocks[:run_blocks] if run_blocks is not None else self.blocks
        for cycle in range(recycles + 1):
            last = cycle == recycles
            with torch.set_grad_enabled(grad and last):
                with maybe_stage(timer, "embedding"):
                    s, z = self._recycle(s_inputs, feats, rows, s.detach(), z.detach() if grad else z, cols)
                if self.msa_module is not None:
                    with maybe_stage(timer, "msa"):
                        z = self.msa_module(feats, s_inputs, z, layout, run_blocks, checkpointing, checkpoint_ops)
                self.block_comm_bytes, self.block_comm, self._block_laps = [], [], None
                replayed = (self.graphs.run(self._run_blocks, blocks, s, z, token_mask, layout)
                            if self.graphs is not None else None)
                if replayed is not None:  # one graph: no per-block times; its peak is the capture's
                    s, z = replayed
                    if timer is not None:
                        timer.note_peak(self.graphs.peak_b)
                    continue
                self._block_laps = Laps(z.device)
                self._block_laps.mark()
                s, z = self._run_blocks(blocks, s, z, token_mask, layout, checkpointing, self._block_laps,
                                                checkpoint_ops)
        return s, z

    def _run_blocks(self, blocks, s: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout,
                    checkpointing: bool = False, laps: Laps | None = None,
                    checkpoint_ops: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The block loop (eager, or recorded into a CUDA graph, ``cuda_graphs``): ``(s, z)``
        after ``blocks``; appends each block's sent bytes to ``block_comm_bytes``, marks ``laps``."""
        for block in blocks:
            before = comm.BYTES.snapshot()
            s, z = run_block(block, s, z, token_mask, layout, checkpointing=checkpointing, checkpoint_ops=checkpoint_ops)
            self.block_comm.append(comm.BYTES.since(before))
            self.block_comm_bytes.append(sum(v["bytes"] for v in self.block_comm[-1].values()))
            if laps is not None:
                laps.mark()
        return s, z
