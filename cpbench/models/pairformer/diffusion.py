"""The diffusion module of AF3 / Boltz-2 (AF3 Algorithms 20-21, 5-6), context-parallel.

Per sampling run, once (``DiffusionModule.prepare``):

* pair conditioning (Alg. 21): ``z = LinearNoBias(LN(concat(z_trunk, relpos)))`` + 2
  transitions, then normalised once (``conditioned.normalize_``) -> ``z_hat: [N/P, N, c_z]``.
  Without autograd this overwrites the trunk's pair buffer row chunk by row chunk: the only
  pair-sized tensor of the whole sampling stage is this one shard, O(N²/P) per rank.
* single conditioning ``s_base = Linear(LN(concat(s_trunk, s_inputs)))``: ``[N/P, c_s]``.
* atom conditioning (Alg. 5 lines 1-12): ``c_l: [A, c_atom]`` (reference features + the
  trunk single of the atom's token) and ``p_lm: [A/32, 32, 128, c_atompair]`` (reference
  geometry + the trunk pair entry ``z_hat[tok(l), tok(m)]`` projected, + ``c_l``/``c_m``),
  with ``A = N_atoms_pad/P`` this rank's atoms (the atoms of its tokens).

Per denoising call (``forward``, batched over the ``S`` samples):
noise-level conditioning of ``s`` (Fourier embedding + 2 transitions), atom encoder (windowed
atom transformer, mean over each token's atoms), token transformer (``blocks`` conditioned
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

from cpbench.models.pairformer import chunking, comm
from cpbench.models.pairformer.atom_attention import (AtomFeatureEmbedder, AtomTransformer, AtomWindows, WINDOW_KEYS,
                                                      WINDOW_QUERIES, atom_windows, halo_extend, key_mask_bias)
from cpbench.models.pairformer.conditioned import (ConditionedAttention, ConditionedTransition, NormedPairBias,
                                                   normalize_)
from cpbench.models.pairformer.embed import N_RELPOS, InputEmbedder
from cpbench.models.pairformer.layout import ONE_D, SERIAL, Layout
from cpbench.models.pairformer.padding import key_bias
from cpbench.models.pairformer.transition import Transition

SIGMA_DATA = 16.0  # AF3 / Boltz: the data standard deviation of atom coordinates (Angstrom)
# Boltz-2 sizes; the presets in conf/model/*.yaml override them under ``diffusion:``.
BOLTZ2_SIZES = dict(c_token=768, blocks=24, heads=16, c_atom=128, c_atompair=16, atom_blocks=3, atom_heads=4,
                    c_fourier=256)


class DiffusionConditioning(nn.Module):
    """AF3 Alg. 21: pair conditioning (once) and noise-level single conditioning (per call)."""

    _relpos_rows = InputEmbedder._relpos_rows  # AF3 Alg. 3 on rows, with this module's own weights

    def __init__(self, c_s: int, c_z: int, c_fourier: int) -> None:
        super().__init__()
        self.relpos = nn.Linear(N_RELPOS, c_z, bias=False)
        self.pair_norm = nn.LayerNorm(2 * c_z)
        self.pair_proj = nn.Linear(2 * c_z, c_z, bias=False)
        self.pair_transitions = nn.ModuleList(Transition(c_z, 2) for _ in range(2))
        self.single_norm = nn.LayerNorm(2 * c_s)
        self.single_proj = nn.Linear(2 * c_s, c_s, bias=False)
        # AF3: the Fourier embedding's weights and phases are drawn once and frozen.
        self.register_buffer("fourier_w", torch.randn(c_fourier))
        self.register_buffer("fourier_b", torch.rand(c_fourier))
        self.noise_norm = nn.LayerNorm(c_fourier)
        self.noise_proj = nn.Linear(c_fourier, c_s, bias=False)
        self.single_transitions = nn.ModuleList(Transition(c_s, 2) for _ in range(2))

    def _pair_rows(self, z_rows: torch.Tensor, feats: dict, rows: slice) -> torch.Tensor:
        return self.pair_proj(self.pair_norm(torch.cat([z_rows, self._relpos_rows(feats, rows)], dim=-1)))

    def pair(self, z: torch.Tensor, feats: dict[str, torch.Tensor], rows: slice) -> torch.Tensor:
        """``z: [N/P, N, c_z]`` trunk pair rows ``rows`` -> ``z_hat`` (normalised conditioning),
        same shape; without autograd in place into ``z``'s storage."""
        if torch.is_grad_enabled():
            z = self._pair_rows(z, feats, rows)
            for transition in self.pair_transitions:
                z = transition(z)
            return F.layer_norm(z, z.shape[-1:])
        n_local, n_pad, c_z = z.shape
        rc = chunking.rows_per_chunk(n_local, n_pad * 8 * c_z * z.element_size(), chunking.budget_bytes(z))
        for rs in chunking.slices(n_local, rc):
            z[rs] = self._pair_rows(z[rs], feats, slice(rows.start + rs.start, rows.start + rs.stop))
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
            bias = self.pair_bias(z_hat[rs]).permute(2, 0, 1) + mask_bias  # [h, r, N]
            return F.scaled_dot_product_attention(q[:, :, rs], k, v, attn_mask=bias.unsqueeze(0).to(q.dtype))

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

    def forward(self, a: torch.Tensor, s: torch.Tensor, z_hat: torch.Tensor, mask_bias: torch.Tensor,
                layout: Layout) -> torch.Tensor:
        """``a: [S, N/P, c_token]``, ``s: [S, N/P, c_s]``, ``z_hat: [N/P, N, c_z]`` (normalised
        pair rows), ``mask_bias: [N]`` over keys. Returns ``[S, N/P, c_token]``."""
        q, k, v, g = self.attention.project(a, s)  # [S, n, h, d]
        kv = comm.all_gather_rows(torch.cat([k, v], dim=-1).transpose(0, 1).contiguous(), layout)  # [N, S, h, 2d]
        k, v = kv.permute(1, 2, 0, 3).chunk(2, dim=-1)  # [S, h, N, d]
        o = self._attend(q.transpose(1, 2), k, v, z_hat, mask_bias).transpose(1, 2)  # [S, n, h, d]
        a = a + self.attention.finish(o, g, s)
        return a + self.transition(a, s)


@dataclass
class DiffusionContext:
    """What ``prepare`` computes once per sampling run (shapes per rank; ``A`` = this rank's atoms).

    Attributes:
        layout: the CP layout; ``windows``: this rank's atom window geometry.
        z_hat: ``[N/P, N, c_z]`` normalised pair conditioning.
        s_base: ``[N/P, c_s]`` noise-independent single conditioning.
        c: ``[A, c_atom]`` atom conditioning; ``p_hat``: ``[A/32, 32, 128, c_atompair]``
            normalised atom-pair conditioning; ``atom_bias``: ``[A/32, 1, 1, 128]`` key mask.
        token_bias: ``[N]`` token key mask; ``atom_token``: ``[A]`` local token of each atom;
        ``atom_weight``: ``[A]`` 1/(real atoms of its token) on real atoms, else 0.
        atom_mask: ``[A]`` bool, real atoms.
    """

    layout: Layout
    windows: AtomWindows
    z_hat: torch.Tensor
    s_base: torch.Tensor
    c: torch.Tensor
    p_hat: torch.Tensor
    atom_bias: torch.Tensor
    token_bias: torch.Tensor
    atom_token: torch.Tensor
    atom_weight: torch.Tensor
    atom_mask: torch.Tensor


class DiffusionModule(nn.Module):
    """The denoiser ``D(x_noisy, t)`` of AF3 Alg. 20, conditioned on the trunk.

    ``prepare(s_trunk, z_trunk, s_inputs, feats, layout) -> DiffusionContext`` once, then
    ``forward(x_noisy, t, ctx, run_blocks) -> x_denoised`` per step (``sampler.sample``).
    """

    def __init__(self, c_s: int, c_z: int, c_token: int = 768, blocks: int = 24, heads: int = 16, c_atom: int = 128,
                 c_atompair: int = 16, atom_blocks: int = 3, atom_heads: int = 4, c_fourier: int = 256,
                 sigma_data: float = SIGMA_DATA) -> None:
        super().__init__()
        self.sigma_data = float(sigma_data)
        self.conditioning = DiffusionConditioning(c_s, c_z, c_fourier)
        self.atom_features = AtomFeatureEmbedder(c_atom, c_atompair)
        self.trunk_single_to_atom = nn.Sequential(nn.LayerNorm(c_s), nn.Linear(c_s, c_atom, bias=False))
        self.trunk_pair_to_atom = NormedPairBias(c_z, c_atompair)
        self.coords_to_atom = nn.Linear(3, c_atom, bias=False)
        self.encoder = AtomTransformer(c_atom, c_atompair, atom_blocks, atom_heads)
        self.atom_to_token = nn.Linear(c_atom, c_token, bias=False)
        self.single_to_token = nn.Sequential(nn.LayerNorm(c_s), nn.Linear(c_s, c_token, bias=False))
        self.token_blocks = nn.ModuleList(TokenTransformerBlock(c_token, c_s, c_z, heads) for _ in range(blocks))
        self.token_norm = nn.LayerNorm(c_token)
        self.token_to_atom = nn.Linear(c_token, c_atom, bias=False)
        self.decoder = AtomTransformer(c_atom, c_atompair, atom_blocks, atom_heads)
        self.atom_out = nn.Sequential(nn.LayerNorm(c_atom), nn.Linear(c_atom, 3, bias=False))

    def _trunk_pair_term(self, z_hat: torch.Tensor, q_token: torch.Tensor, k_token: torch.Tensor) -> torch.Tensor:
        """``LinearNoBias(LN(z[tok(l), tok(m)]))`` per window: ``q_token: [nb, 32]`` local rows,
        ``k_token: [nb, 128]`` global columns -> ``[nb, 32, 128, c_atompair]``; the gathered
        ``z`` entries are chunked over windows without autograd."""
        def windows(ws: slice) -> torch.Tensor:
            return self.trunk_pair_to_atom(z_hat[q_token[ws, :, None], k_token[ws, None, :]])

        nb = q_token.shape[0]
        if torch.is_grad_enabled():
            return windows(slice(0, nb))
        c_ap = self.trunk_pair_to_atom.proj.out_features
        out = z_hat.new_empty((nb, WINDOW_QUERIES, WINDOW_KEYS, c_ap))
        per_window_b = WINDOW_QUERIES * WINDOW_KEYS * z_hat.shape[-1] * 2 * z_hat.element_size()
        wc = chunking.rows_per_chunk(nb, per_window_b, chunking.budget_bytes(z_hat))
        for ws in chunking.slices(nb, wc):
            out[ws] = windows(ws)
        return out

    def prepare(self, s_trunk: torch.Tensor, z_trunk: torch.Tensor, s_inputs: torch.Tensor,
                feats: dict[str, torch.Tensor], layout: Layout) -> DiffusionContext:
        """Conditioning for a whole sampling run.

        Args:
            s_trunk: ``[N/P, c_s]``; z_trunk: ``[N/P, N, c_z]`` (overwritten without autograd);
            s_inputs: ``[N, c_s]`` (global, O(N)); feats: global padded features.
        """
        if layout.kind not in (SERIAL, ONE_D):
            raise ValueError(f"sampling: the diffusion module implements topology 1d only (layout {layout.kind!r})")
        token_mask = feats["token_mask"]
        rows = layout.rows(token_mask.shape[0])
        windows = atom_windows(layout, feats["atom_to_token"].shape[0])
        atom_token_global = feats["atom_to_token"]
        atom_token = atom_token_global[windows.local()] - rows.start
        atom_mask = feats["atom_mask"][windows.local()]
        if int(atom_token.min()) < 0 or int(atom_token.max()) >= rows.stop - rows.start:
            raise ValueError("atoms are not laid out with their tokens (pad_features with units = CP size)")

        z_hat = self.conditioning.pair(z_trunk, feats, rows)
        s_base = self.conditioning.single(s_trunk, s_inputs[rows])
        c = self.atom_features.single(feats, windows) + self.trunk_single_to_atom(s_trunk)[atom_token]
        k_token = atom_token_global[windows.key_global(c.device).clamp(0, windows.n_total - 1)]
        pair_term = self._trunk_pair_term(z_hat, atom_token.view(windows.n_windows, WINDOW_QUERIES), k_token)
        p = self.atom_features.pair(feats, c, halo_extend(c, layout), windows, extra=pair_term)
        del pair_term
        counts = torch.zeros(rows.stop - rows.start, device=c.device).index_add_(0, atom_token, atom_mask.float())
        weight = atom_mask.float() / counts.clamp_min(1)[atom_token]
        return DiffusionContext(layout=layout, windows=windows, z_hat=z_hat, s_base=s_base, c=c,
                                p_hat=F.layer_norm(p, p.shape[-1:]),
                                atom_bias=key_mask_bias(windows, feats["atom_mask"], c.dtype),
                                token_bias=key_bias(token_mask, c.dtype), atom_token=atom_token,
                                atom_weight=weight.to(c.dtype), atom_mask=atom_mask)

    def forward(self, x_noisy: torch.Tensor, t: torch.Tensor, ctx: DiffusionContext,
                run_blocks: int | None = None) -> torch.Tensor:
        """AF3 Alg. 20.

        Args:
            x_noisy: ``[S, A, 3]`` fp32 noisy coordinates of this rank's atoms.
            t: ``[S]`` fp32 noise levels.
            run_blocks: run only the first ``run_blocks`` token blocks (probe depth).
        Returns:
            ``[S, A, 3]`` fp32 denoised coordinates.
        """
        sd, dtype = self.sigma_data, ctx.c.dtype
        t3 = t[:, None, None]
        r_noisy = (x_noisy / torch.sqrt(t3.square() + sd ** 2)).to(dtype)
        s = self.conditioning.single_at(ctx.s_base, torch.log(t / sd) / 4)  # [S, n, c_s]

        q = self.encoder(ctx.c + self.coords_to_atom(r_noisy), ctx.c, ctx.p_hat, ctx.atom_bias, ctx.windows, ctx.layout)
        per_atom = F.relu(self.atom_to_token(q)) * ctx.atom_weight[:, None]  # [S, A, c_token]
        a = per_atom.new_zeros((q.shape[0], s.shape[1], per_atom.shape[-1])).index_add(1, ctx.atom_token, per_atom)
        a = a + self.single_to_token(s)
        blocks = self.token_blocks[:run_blocks] if run_blocks is not None else self.token_blocks
        for block in blocks:
            a = block(a, s, ctx.z_hat, ctx.token_bias, ctx.layout)
        a = self.token_norm(a)

        q = q + self.token_to_atom(a)[:, ctx.atom_token]
        q = self.decoder(q, ctx.c, ctx.p_hat, ctx.atom_bias, ctx.windows, ctx.layout)
        r_update = self.atom_out(q).float()
        t2 = t3.square()
        return sd ** 2 / (sd ** 2 + t2) * x_noisy + sd * t3 / torch.sqrt(sd ** 2 + t2) * r_update
