"""The diffusion module of AF3 / Boltz-2 (AF3 Algorithms 20-21, 5-6), context-parallel.

Per sampling run, once (``DiffusionModule.prepare``):

* pair conditioning (Alg. 21): ``z = LinearNoBias(LN(concat(z_trunk, relpos)))`` + 2
  transitions, then normalised once (``conditioned.normalize_``) -> ``z_hat: [N/P, N, c_z]``.
  Without autograd this overwrites the trunk's pair buffer row chunk by row chunk: the only
  pair-sized tensor of the whole sampling stage is this one shard, O(N²/P) per rank.
* single conditioning ``s_base = Linear(LN(concat(s_trunk, s_inputs)))``: ``[N/P, c_s]``.
* atom conditioning (Alg. 5 lines 1-12, the trunk's ``atom_encoder`` with the trunk terms):
  ``c_l`` (reference features + the trunk single of the atom's token) for every atom, and the
  encoder's and decoder's per-block atom pair biases ``[W, 2·blocks·heads, 32, 128]`` from
  ``p_lm`` (reference geometry, ``c_l``/``c_m``, and the trunk pair entry
  ``z_hat[tok(l), tok(m)]`` read from the local rows: a query atom's token is local).

Per denoising call (``forward``, batched over the ``S`` samples):
noise-level conditioning of ``s`` (Fourier embedding + 2 transitions), atom encoder (32 x 128
windows over the real atoms, keys/values all-gathered per block as in the trunk's atom
encoder; mean over each token's atoms), token transformer (``blocks`` conditioned
blocks; each layer's pair bias ``[rows, N, heads]`` is projected from the LOCAL ``z_hat`` rows
for a chunk of query rows at a time, never ``N x N x (layers·heads)``; keys and values are
all-gathered as in the trunk's single attention, ``2·(P-1)·S·N/P·c_token`` elements sent per
layer), atom decoder, EDM preconditioning (``c_skip``, ``c_out``, ``c_in``; sigma_data 16).

Sizes (Boltz-2): c_token 768 (2·c_s), 24 token blocks x 16 heads, atom encoder and decoder 3
blocks x 4 heads, c_atom 128, c_atompair 16, Fourier 256. Inference only (no training path is
benchmarked); the ops are written autograd-clean where it costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.models.pairformer.layers.atom_windows import AtomWindows, atom_windows
from cpbench.models.pairformer.layers.conditioned import ConditionedAttention, ConditionedTransition, NormedPairBias, normalize_
from cpbench.models.pairformer.layers.embed import N_RELPOS, InputEmbedder
from cpbench.models.pairformer.layers.transition import Transition
from cpbench.models.pairformer.modules.atom_encoder import AtomAttentionEncoder
from cpbench.models.pairformer.ops.layer_norm import LayerNorm, layer_norm
from cpbench.models.pairformer.ops.sdpa_lse import sdpa_with_lse
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import TWO_D, Layout
from cpbench.models.pairformer.parallel.padding import key_bias

SIGMA_DATA = 16.0  # AF3 / Boltz: the data standard deviation of atom coordinates (Angstrom)
# Boltz-2 sizes; the presets in cpbench/conf/model/*.yaml override them under ``diffusion:``.
BOLTZ2_SIZES = dict(c_token=768, blocks=24, heads=16, c_atom=128, c_atompair=16, atom_blocks=3, atom_heads=4,
                    c_fourier=256)


class DiffusionConditioning(nn.Module):
    """AF3 Alg. 21: pair conditioning (once) and noise-level single conditioning (per call)."""

    _relpos_rows = InputEmbedder._relpos_rows  # AF3 Alg. 3 on rows, with this module's own weights

    def __init__(self, c_s: int, c_z: int, c_fourier: int) -> None:
        super().__init__()
        self.relpos = nn.Linear(N_RELPOS, c_z, bias=False)
        self.pair_norm = LayerNorm(2 * c_z)
        self.pair_proj = nn.Linear(2 * c_z, c_z, bias=False)
        self.pair_transitions = nn.ModuleList(Transition(c_z, 2) for _ in range(2))
        self.single_norm = LayerNorm(2 * c_s)
        self.single_proj = nn.Linear(2 * c_s, c_s, bias=False)
        # AF3: the Fourier embedding's weights and phases are drawn once and frozen.
        self.register_buffer("fourier_w", torch.randn(c_fourier))
        self.register_buffer("fourier_b", torch.rand(c_fourier))
        self.noise_norm = LayerNorm(c_fourier)
        self.noise_proj = nn.Linear(c_fourier, c_s, bias=False)
        self.single_transitions = nn.ModuleList(Transition(c_s, 2) for _ in range(2))

    def _pair_rows(self, z_rows: torch.Tensor, feats: dict, rows: slice, cols: slice) -> torch.Tensor:
        return self.pair_proj(self.pair_norm(torch.cat([z_rows, self._relpos_rows(feats, rows, cols)], dim=-1)))

    def pair(self, z: torch.Tensor, feats: dict[str, torch.Tensor], rows: slice, cols: slice) -> torch.Tensor:
        """``z: [N/P, N, c_z]`` (2d: ``[R, C, c_z]``) trunk pair rows ``rows``, columns ``cols``
        -> ``z_hat`` (normalised conditioning), same shape; without autograd in place into
        ``z``'s storage."""
        if torch.is_grad_enabled():
            z = self._pair_rows(z, feats, rows, cols)
            for transition in self.pair_transitions:
                z = transition(z)
            return layer_norm(z, z.shape[-1:])
        n_local, n_pad, c_z = z.shape
        rc = chunking.rows_per_chunk(n_local, n_pad * 8 * c_z * z.element_size(), chunking.budget_bytes(z))
        for rs in chunking.slices(n_local, rc):
            z[rs] = self._pair_rows(z[rs], feats, slice(rows.start + rs.start, rows.start + rs.stop), cols)
        for transition in self.pair_transitions:
            z = transition(z)
        return normalize_(z)

    def single(self, s_trunk: torch.Tensor, s_inputs: torch.Tensor) -> torch.Tensor:
        """``[N/P, c_s]`` x2 -> ``s_base: [N/P, c_s]`` (the noise-independent part)."""
        return self.single_proj(self.single_norm(torch.cat([s_trunk, s_inputs], dim=-1)))

    def single_at(self, s_base: torch.Tensor, c_noise: torch.Tensor) -> torch.Tensor:
        """``s_base: [N/P, c_s]``, ``c_noise: [S]`` -> ``s: [S, N/P, c_s]``."""
        fourier = torch.cos(2 * torch.pi * (c_noise[:, None] * self.fourier_w + self.fourier_b))
        noise = self.noise_proj(self.noise_norm(fourier.to(s_base.dtype)))  # [S, c_s]
        s = s_base[None] + noise[:, None]
        for transition in self.single_transitions:
            s = transition(s)
        return s


class TokenTransformerBlock(nn.Module):
    """One block of the diffusion module's token transformer (AF3 Alg. 23 with Alg. 24/25)."""

    def __init__(self, c_token: int, c_s: int, c_z: int, heads: int) -> None:
        super().__init__()
        self.attention = ConditionedAttention(c_token, c_s, heads)
        self.pair_bias = NormedPairBias(c_z, heads)
        self.transition = ConditionedTransition(c_token, c_s)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, z_hat: torch.Tensor,
                mask_bias: torch.Tensor) -> torch.Tensor:
        """``q: [S, h, n, d]``, ``k, v: [S, h, N, d]``, ``z_hat: [n, N, c_z]`` -> ``[S, h, n, d]``.

        Without autograd the query rows are chunked so that one chunk's bias ``[r, N, h]`` (and
        on CPU its logits ``[S, h, r, N]``) is the only bias-sized transient.
        """
        def rows(rs: slice) -> torch.Tensor:
            # contiguous: unit last-dim stride for CUDA's memory-efficient SDPA (as in single_att)
            bias = (self.pair_bias(z_hat[rs]).permute(2, 0, 1) + mask_bias).to(q.dtype).contiguous()  # [h, r, N]
            return F.scaled_dot_product_attention(q[:, :, rs], k, v, attn_mask=bias.unsqueeze(0))

        n_local = q.shape[2]
        if torch.is_grad_enabled():
            return rows(slice(0, n_local))
        n_samples, h, _, _ = q.shape
        n_pad = k.shape[2]
        per_row_b = n_pad * h * (2 + (0 if q.is_cuda else 2 * n_samples)) * q.element_size()
        rc = chunking.rows_per_chunk(n_local, per_row_b, chunking.budget_bytes(z_hat))
        o = torch.empty_like(q)
        for rs in chunking.slices(n_local, rc):
            o[:, :, rs] = rows(rs)
        return o

    def _attend_tile(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, z_hat: torch.Tensor,
                     mask_bias: torch.Tensor, layout: Layout) -> torch.Tensor:
        """2d (no autograd): queries ``R_a`` over the keys ``C_b`` of this tile, ``q: [S, h, R, d]``,
        ``k, v: [S, h, C, d]``, ``z_hat: [R, C, c_z]``; the grid row's ``cp1`` partial softmaxes
        are merged with log-sum-exp weights (one all-reduce of ``[S, h, r, d+1]`` per query
        chunk, chunks agreed over the grid). Returns ``[S, h, R, d]``, the same on the grid row."""
        if torch.is_grad_enabled():
            raise NotImplementedError("the 2d diffusion token attention is inference-only")
        row = layout.row_axis()
        n_samples, h, n_rows, d = q.shape
        per_row_b = k.shape[2] * h * (2 + (0 if q.is_cuda else 2 * n_samples)) * q.element_size()
        rc = comm.agree_min(chunking.rows_per_chunk(n_rows, per_row_b, chunking.budget_bytes(z_hat)), layout, z_hat)
        o = torch.empty_like(q)
        for rs in chunking.slices(n_rows, rc):
            bias = (self.pair_bias(z_hat[rs]).permute(2, 0, 1) + mask_bias).to(q.dtype).contiguous()  # [h, r, C]
            o_part, lse = sdpa_with_lse(q[:, :, rs].contiguous(), k, v, bias.expand(n_samples, *bias.shape))
            lse = lse.float()
            w = torch.exp(lse - comm.max_over_(lse.clone(), row))[..., None]  # [S, h, r, 1]
            num_den = comm.all_reduce_(torch.cat([o_part.float() * w, w], dim=-1), row)
            o[:, :, rs] = (num_den[..., :d] / num_den[..., d:]).to(q.dtype)
        return o

    def forward(self, a: torch.Tensor, s: torch.Tensor, z_hat: torch.Tensor, mask_bias: torch.Tensor,
                layout: Layout) -> torch.Tensor:
        """``a: [S, N/P, c_token]``, ``s: [S, N/P, c_s]``, ``z_hat: [N/P, N, c_z]`` (normalised
        pair rows), ``mask_bias: [N]`` over keys. Returns ``[S, N/P, c_token]``.

        2d: ``a, s: [S, R, ·]`` (tokens ``R_a``, replicated over the grid row), ``z_hat: [R, C, c_z]``
        tile; keys/values all-gathered along the grid column (``2·(cp0-1)·S·R·c_token``
        elements sent), partial softmaxes merged along the grid row."""
        q, k, v, g = self.attention.project(a, s)  # [S, n, h, d]
        kv = torch.cat([k, v], dim=-1).transpose(0, 1).contiguous()  # [n, S, h, 2d]
        if layout.kind == TWO_D:  # keys of this tile's columns, from the grid column
            cols = layout.cols(mask_bias.shape[0])
            kv = comm.all_gather_rows(kv, layout.single_axis())[cols]  # [C, S, h, 2d]
            k, v = kv.permute(1, 2, 0, 3).chunk(2, dim=-1)  # [S, h, C, d]
            o = self._attend_tile(q.transpose(1, 2), k, v, z_hat, mask_bias[cols], layout).transpose(1, 2)
        else:
            kv = comm.all_gather_rows(kv, layout)  # [N, S, h, 2d]
            k, v = kv.permute(1, 2, 0, 3).chunk(2, dim=-1)  # [S, h, N, d]
            o = self._attend(q.transpose(1, 2), k, v, z_hat, mask_bias).transpose(1, 2)  # [S, n, h, d]
        a = a + self.attention.finish(o, g, s)
        return a + self.transition(a, s)


@dataclass
class DiffusionContext:
    """What ``prepare`` computes once per sampling run (shapes per rank; ``A = N_atoms_pad/P``
    this rank's atom slots, ``W`` its atom windows).

    Attributes:
        layout: the CP layout of the pair (serial, 1d or 2d); ``atom_layout``: the 1d layout
            of token- and atom-indexed work (``layout.single_axis()``: 2d shards atoms over the
            grid column and replicates them over the grid row); ``rows``: its token rows;
            ``local``: its atom slots.
        feats: the global padded features (O(N + N_atoms)).
        windows: this rank's atom windows (``atom_windows.py``: over the real atoms).
        z_hat: ``[N/P, N, c_z]`` (2d: ``[R, C, c_z]``) normalised pair conditioning.
        s_base: ``[N/P, c_s]`` noise-independent single conditioning.
        c: ``[A, c_atom]`` atom conditioning.
        atom_bias: ``[W, 2·atom_blocks·atom_heads, 32, 128]`` encoder then decoder pair biases
            (with the key mask).
        token_bias: ``[N]`` token key mask; ``atom_token``: ``[A]`` local token of each slot.
        atom_mask: ``[A]`` bool, real atoms; ``real_index``: ``[A]`` each slot's index among
            the real atoms of the whole example (global order, the same at every cp);
            ``n_real``: real atoms in the example.
    """

    layout: Layout
    atom_layout: Layout
    rows: slice
    local: slice
    feats: dict
    windows: AtomWindows
    z_hat: torch.Tensor
    s_base: torch.Tensor
    c: torch.Tensor
    atom_bias: torch.Tensor
    token_bias: torch.Tensor
    atom_token: torch.Tensor
    atom_mask: torch.Tensor
    real_index: torch.Tensor
    n_real: int


class DiffusionModule(nn.Module):
    """The denoiser ``D(x_noisy, t)`` of AF3 Alg. 20, conditioned on the trunk.

    ``prepare(s_trunk, z_trunk, s_inputs, feats, layout) -> DiffusionContext`` once, then
    ``forward(x_noisy, t, ctx, run_blocks) -> x_denoised`` per step (``sampler.sample``).

    The atom side reuses the trunk's atom encoder (``atom_encoder.AtomAttentionEncoder``):
    reference features, windows over the real atoms (so outputs do not depend on cp) and its
    transformer blocks. The encoder's and the decoder's atom transformers are the first and the
    last ``atom_blocks`` blocks of one ``AtomAttentionEncoder`` with ``2·atom_blocks`` blocks:
    their pair biases are projected together from the one ``p_lm``, which AF3 shares between
    encoder and decoder (``p_skip``). Its blocks take one sample at a time, so the samples loop
    around them (``S`` key/value all-gathers per block instead of one, the same bytes).
    """

    def __init__(self, c_s: int, c_z: int, c_token: int = 768, blocks: int = 24, heads: int = 16, c_atom: int = 128,
                 c_atompair: int = 16, atom_blocks: int = 3, atom_heads: int = 4, c_fourier: int = 256,
                 sigma_data: float = SIGMA_DATA) -> None:
        super().__init__()
        self.sigma_data, self.atom_blocks, self.atom_heads = float(sigma_data), atom_blocks, atom_heads
        self.conditioning = DiffusionConditioning(c_s, c_z, c_fourier)
        self.atoms = AtomAttentionEncoder(c_atom, c_atompair, c_token, blocks=2 * atom_blocks, heads=atom_heads)
        self.trunk_single_to_atom = nn.Sequential(LayerNorm(c_s), nn.Linear(c_s, c_atom, bias=False))
        self.trunk_pair_to_atom = NormedPairBias(c_z, c_atompair)
        self.coords_to_atom = nn.Linear(3, c_atom, bias=False)
        self.single_to_token = nn.Sequential(LayerNorm(c_s), nn.Linear(c_s, c_token, bias=False))
        self.token_blocks = nn.ModuleList(TokenTransformerBlock(c_token, c_s, c_z, heads) for _ in range(blocks))
        self.token_norm = LayerNorm(c_token)
        self.token_to_atom = nn.Linear(c_token, c_atom, bias=False)
        self.atom_out = nn.Sequential(LayerNorm(c_atom), nn.Linear(c_atom, 3, bias=False))

    def prepare(self, s_trunk: torch.Tensor, z_trunk: torch.Tensor, s_inputs: torch.Tensor,
                feats: dict[str, torch.Tensor], layout: Layout) -> DiffusionContext:
        """Conditioning for a whole sampling run.

        Args:
            s_trunk: ``[N/P, c_s]``; z_trunk: ``[N/P, N, c_z]`` (overwritten without autograd);
            s_inputs: ``[N, c_s]`` (global, O(N)); feats: global features padded with
            ``units = P`` (``cpbench.data.sharding.pad_features``).
            2d: ``s_trunk: [R, c_s]``, ``z_trunk: [R, C, c_z]`` (tile ``R_a x C_b``).
        Collectives: one all-gather of ``s_trunk`` (``(P-1)·N/P·c_s`` elements sent); 2d also
        sums the atom pairs' trunk-pair term over the grid row (``[W, 32, 128, c_atompair]``).
        """
        atom_layout = layout.single_axis()
        token_mask, atom_mask, a2t = feats["token_mask"], feats["atom_mask"], feats["atom_to_token"]
        n_pad = token_mask.shape[0]
        rows, cols, local = layout.rows(n_pad), layout.cols(n_pad), atom_layout.rows(atom_mask.shape[0])
        n_local = rows.stop - rows.start
        atom_token = a2t[local] - rows.start
        if int(atom_token.min()) < 0 or int(atom_token.max()) >= n_local:
            raise ValueError("atoms are not laid out with their tokens (pad_features with units = CP size)")

        z_hat = self.conditioning.pair(z_trunk, feats, rows, cols)
        s_base = self.conditioning.single(s_trunk, s_inputs[rows])
        # Every rank computes c for all atoms (O(N_atoms), cheaper than gathering it): key atoms
        # of a window may belong to other ranks.
        s_all = comm.all_gather_rows(s_trunk.contiguous(), atom_layout)  # [N, c_s]
        c_all = self.atoms.atom_single(feats) + self.trunk_single_to_atom(s_all)[a2t]  # [A_pad, c_atom]
        del s_all

        def trunk_pair(qg: torch.Tensor, kg: torch.Tensor) -> torch.Tensor:
            """``LinearNoBias(LN(z[tok(l), tok(m)]))``: ``[w, 32]``, ``[w, 128]`` global slots ->
            ``[w, 32, 128, c_atompair]``; query tokens are local rows (placeholder slots of
            windows without a query are clamped into range; their rows are never used). 2d: each
            rank of the grid row projects the entries of its columns, the row sums them."""
            q_rows = (a2t[qg] - rows.start).clamp(0, n_local - 1)[:, :, None]
            k_cols = a2t[kg][:, None, :] - cols.start
            if layout.kind != TWO_D:
                return self.trunk_pair_to_atom(z_hat[q_rows, k_cols])
            inside = ((k_cols >= 0) & (k_cols < cols.stop - cols.start))[..., None]
            term = self.trunk_pair_to_atom(z_hat[q_rows, k_cols.clamp(0, cols.stop - cols.start - 1)]) * inside
            return comm.all_reduce_(term, layout.row_axis())

        windows = atom_windows(atom_mask, local)
        budget_b = chunking.budget_bytes(c_all)
        if layout.kind == TWO_D:  # the window chunks run a row all-reduce each: same count on the row
            budget_b = comm.agree_min(budget_b, layout, c_all)
        with chunking.override_budget(budget_b):
            atom_bias = self.atoms.all_pair_bias(feats, c_all, windows, local.start, trunk_pair)
        real_index = (torch.cumsum(atom_mask.long(), 0) - 1)[local].clamp_min(0)
        return DiffusionContext(layout=layout, atom_layout=atom_layout, rows=rows, local=local, feats=feats, windows=windows,
                                z_hat=z_hat,
                                s_base=s_base, c=c_all[local].contiguous(), atom_bias=atom_bias,
                                token_bias=key_bias(token_mask, c_all.dtype), atom_token=atom_token,
                                atom_mask=atom_mask[local], real_index=real_index, n_real=int(atom_mask.sum()))

    def _atom_transformer(self, q: torch.Tensor, ctx: DiffusionContext, decoder: bool) -> torch.Tensor:
        """``q: [S, A, c_atom]`` through the encoder's (or the decoder's) atom blocks."""
        h, first = self.atom_heads, self.atom_blocks if decoder else 0
        out = []
        for q_sample in q.unbind(0):
            for i in range(first, first + self.atom_blocks):
                bias = ctx.atom_bias[:, i * h:(i + 1) * h]
                q_sample = self.atoms.blocks[i](q_sample, ctx.c, bias, ctx.windows, ctx.atom_layout)
            out.append(q_sample)
        return torch.stack(out)

    def forward(self, x_noisy: torch.Tensor, t: torch.Tensor, ctx: DiffusionContext,
                run_blocks: int | None = None) -> torch.Tensor:
        """AF3 Alg. 20.

        Args:
            x_noisy: ``[S, A, 3]`` fp32 noisy coordinates of this rank's atom slots.
            t: ``[S]`` fp32 noise levels.
            run_blocks: run only the first ``run_blocks`` token blocks (probe depth).
        Returns:
            ``[S, A, 3]`` fp32 denoised coordinates (padding slots: meaningless).
        """
        sd, dtype = self.sigma_data, ctx.c.dtype
        t3 = t[:, None, None]
        r_noisy = (x_noisy / torch.sqrt(t3.square() + sd ** 2)).to(dtype)
        s = self.conditioning.single_at(ctx.s_base, torch.log(t / sd) / 4)  # [S, N/P, c_s]

        q = self._atom_transformer(ctx.c + self.coords_to_atom(r_noisy), ctx, decoder=False)  # [S, A, c_atom]
        a = torch.stack([self.atoms._to_tokens(q_sample, ctx.feats, ctx.local, ctx.rows) for q_sample in q.unbind(0)])
        a = a + self.single_to_token(s)  # [S, N/P, c_token]
        blocks = self.token_blocks[:run_blocks] if run_blocks is not None else self.token_blocks
        for block in blocks:
            a = block(a, s, ctx.z_hat, ctx.token_bias, ctx.layout)
        a = self.token_norm(a)

        q = self._atom_transformer(q + self.token_to_atom(a)[:, ctx.atom_token], ctx, decoder=True)
        r_update = self.atom_out(q).float()
        t2 = t3.square()
        return sd ** 2 / (sd ** 2 + t2) * x_noisy + sd * t3 / torch.sqrt(sd ** 2 + t2) * r_update
