"""Sequence-local atom attention (AF3 Algorithms 5-7): 32-query x 128-key windows, sharded.

The padded atom axis (``cpbench.data.sharding.pad_features``) is cut into blocks of 32 query
atoms; block ``b`` (global atoms ``[32b, 32b+32)``) attends to the 128 keys
``[32b-48, 32b+80)``, keys outside the atom axis or on padding atoms masked. Never
``N_atoms²``: pair terms live per window, ``[N_atoms/32, 32, 128, c]``.

Sharding (1d): rank ``r`` holds the atoms of its tokens, ``[r·A, (r+1)·A)`` with ``A =
N_atoms_pad/P`` (a multiple of 32, so windows never straddle ranks as queries). Keys reach
48 atoms past each end of the shard: ``halo_extend`` brings them (one all-gather of every
rank's first and last ``min(48, A)`` atoms, ``(P-1)·2·min(48, A)·c`` elements sent per rank;
when ``A < 48`` the halo spans several ranks, which the same gathered edges cover). The
serial layout pads 48 masked atoms on each side, so both run the same window code.

Contents: ``AtomWindows`` (this rank's window geometry), ``halo_extend``,
``AtomFeatureEmbedder`` (per-atom ``c_l`` and per-window ``p_lm`` from reference features,
AF3 Alg. 5 lines 1-6, 11-12) and ``AtomTransformer`` (Alg. 7: conditioned blocks with
windowed attention biased by ``p_lm``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.data.sharding import ATOM_WINDOW_QUERIES
from cpbench.data.synthetic import NUM_ELEMENTS, NUM_NAME_CHARS
from cpbench.models.pairformer import comm
from cpbench.models.pairformer.conditioned import ConditionedAttention, ConditionedTransition, NormedPairBias
from cpbench.models.pairformer.layout import Layout
from cpbench.models.pairformer.padding import MASKED_LOGIT

WINDOW_QUERIES = ATOM_WINDOW_QUERIES  # 32
WINDOW_KEYS = 128
HALO = (WINDOW_KEYS - WINDOW_QUERIES) // 2  # 48 keys before and after each query block
# AF3 reference features per atom: ref_pos 3, ref_charge 1, ref_mask 1, element one-hot,
# four one-hot name characters.
N_ATOM_FEATS = 3 + 1 + 1 + NUM_ELEMENTS + 4 * NUM_NAME_CHARS


@dataclass(frozen=True)
class AtomWindows:
    """This rank's atoms ``[start, start + n_local)`` of ``n_total`` padded atoms."""

    start: int
    n_local: int
    n_total: int

    @property
    def n_windows(self) -> int:
        return self.n_local // WINDOW_QUERIES

    def key_index(self, device: torch.device) -> torch.Tensor:
        """``[n_windows, 128]`` indices into the halo-extended local axis (``halo_extend``)."""
        return (torch.arange(self.n_windows, device=device) * WINDOW_QUERIES)[:, None] + \
            torch.arange(WINDOW_KEYS, device=device)

    def key_global(self, device: torch.device) -> torch.Tensor:
        """``[n_windows, 128]`` global atom index of each key (may fall outside the axis)."""
        return self.key_index(device) + (self.start - HALO)

    def key_valid(self, atom_mask: torch.Tensor) -> torch.Tensor:
        """``[n_windows, 128]`` bool: the key exists and is a real atom (``atom_mask: [N_atoms_pad]``)."""
        pos = self.key_global(atom_mask.device)
        inside = (pos >= 0) & (pos < self.n_total)
        return inside & atom_mask[pos.clamp(0, self.n_total - 1)]

    def local(self) -> slice:
        return slice(self.start, self.start + self.n_local)


def atom_windows(layout: Layout, n_atoms_pad: int) -> AtomWindows:
    """The window geometry of this rank (atoms split in equal, 32-aligned blocks)."""
    n_local = n_atoms_pad // layout.size
    if n_local * layout.size != n_atoms_pad or n_local % WINDOW_QUERIES:
        raise ValueError(f"{n_atoms_pad} padded atoms do not split into {layout.size} blocks of 32-atom windows")
    return AtomWindows(layout.rank * n_local, n_local, n_atoms_pad)


def halo_extend(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """This rank's atoms with 48 neighbours on each side (zeros beyond the atom axis).

    Args:
        x: ``[A, ...]`` this rank's atoms (``A = N_atoms_pad/P``, equal on every rank).
    Returns:
        ``[48 + A + 48, ...]``. Serial: zero padding. 1d: one all-gather of the edges
        ``[2, min(48, A), ...]`` (autograd-aware: its backward reduce-scatters).
    """
    a = x.shape[0]
    if not layout.sharded:
        pad = x.new_zeros((HALO, *x.shape[1:]))
        return torch.cat([pad, x, pad])
    h = min(HALO, a)
    edges = comm.all_gather_rows(torch.stack([x[:h], x[a - h:]]).contiguous(), layout)  # [2P, h, ...]
    edges = edges.view(layout.size, 2, h, *x.shape[1:])
    start, stop, total = layout.rank * a, (layout.rank + 1) * a, layout.size * a
    left, right = [], []
    for q in range(layout.size):
        if q < layout.rank:  # q's last h atoms cover [(q+1)a - h, (q+1)a)
            first = (q + 1) * a - h
            lo, hi = max(start - HALO, first), min(start, (q + 1) * a)
            if lo < hi:
                left.append(edges[q, 1, lo - first:hi - first])
        elif q > layout.rank:  # q's first h atoms cover [q·a, q·a + h)
            first = q * a
            lo, hi = max(stop, first), min(stop + HALO, first + h)
            if lo < hi:
                right.append(edges[q, 0, lo - first:hi - first])
    before = max(0, HALO - start)  # keys before atom 0
    after = max(0, stop + HALO - total)  # keys past the last atom
    parts = [x.new_zeros((before, *x.shape[1:])), *left, x, *right, x.new_zeros((after, *x.shape[1:]))]
    return torch.cat(parts)


def window_keys(x_ext: torch.Tensor, windows: AtomWindows) -> torch.Tensor:
    """``x_ext: [48 + A + 48, ...]`` -> the keys of every window ``[A/32, 128, ...]``."""
    return x_ext[windows.key_index(x_ext.device)]


def key_mask_bias(windows: AtomWindows, atom_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive bias over the keys of each window: ``[A/32, 1, 1, 128]``, 0 or ``MASKED_LOGIT``."""
    return ((~windows.key_valid(atom_mask)).to(dtype) * MASKED_LOGIT)[:, None, None, :]


class AtomFeatureEmbedder(nn.Module):
    """Per-atom single ``c_l`` and per-window pair ``p_lm`` from reference features (AF3 Alg. 5).

    Features are the global padded atom features (``FEATURE_SPEC``: ``ref_pos``,
    ``ref_charge``, ``atom_mask``, ``ref_element``, ``ref_atom_name_chars``, ``ref_space_uid``).
    """

    def __init__(self, c_atom: int, c_atompair: int) -> None:
        super().__init__()
        self.single_proj = nn.Linear(N_ATOM_FEATS, c_atom, bias=False)
        self.offset_proj = nn.Linear(3, c_atompair, bias=False)
        self.dist_proj = nn.Linear(1, c_atompair, bias=False)
        self.valid_proj = nn.Linear(1, c_atompair, bias=False)
        self.single_to_pair_q = nn.Linear(c_atom, c_atompair, bias=False)
        self.single_to_pair_k = nn.Linear(c_atom, c_atompair, bias=False)
        self.pair_mlp = nn.Sequential(nn.ReLU(), nn.Linear(c_atompair, c_atompair, bias=False), nn.ReLU(),
                                      nn.Linear(c_atompair, c_atompair, bias=False), nn.ReLU(),
                                      nn.Linear(c_atompair, c_atompair, bias=False))

    def single(self, feats: dict[str, torch.Tensor], windows: AtomWindows) -> torch.Tensor:
        """``c_l: [A, c_atom]`` for this rank's atoms."""
        dtype, rows = self.single_proj.weight.dtype, windows.local()
        x = torch.cat([feats["ref_pos"][rows], feats["ref_charge"][rows, None], feats["atom_mask"][rows, None],
                       F.one_hot(feats["ref_element"][rows], NUM_ELEMENTS),
                       F.one_hot(feats["ref_atom_name_chars"][rows], NUM_NAME_CHARS).flatten(-2)], dim=-1)
        return self.single_proj(x.to(dtype))

    def pair(self, feats: dict[str, torch.Tensor], c: torch.Tensor, c_ext: torch.Tensor, windows: AtomWindows,
             extra: torch.Tensor | None = None) -> torch.Tensor:
        """``p_lm: [A/32, 32, 128, c_atompair]`` for this rank's windows.

        Args:
            c: ``[A, c_atom]`` this rank's ``c_l``; ``c_ext``: its ``halo_extend``.
            extra: an optional ``[A/32, 32, 128, c_atompair]`` term added before the MLP
                (the trunk-pair term of the diffusion module's encoder).
        """
        dtype, device = self.offset_proj.weight.dtype, c.device
        nb = windows.n_windows
        q_pos = torch.arange(windows.start, windows.start + windows.n_local, device=device).view(nb, WINDOW_QUERIES)
        k_pos = windows.key_global(device).clamp(0, windows.n_total - 1)
        ref, uid = feats["ref_pos"], feats["ref_space_uid"]
        offset = (ref[q_pos][:, :, None] - ref[k_pos][:, None, :]).to(dtype)  # [nb, 32, 128, 3]
        same = (uid[q_pos][:, :, None] == uid[k_pos][:, None, :]) & windows.key_valid(feats["atom_mask"])[:, None, :]
        v = same[..., None].to(dtype)
        inv_dist = 1.0 / (1.0 + offset.square().sum(-1, keepdim=True))
        p = (self.offset_proj(offset) + self.dist_proj(inv_dist) + self.valid_proj(v)) * v
        if extra is not None:
            p = p + extra
        p = p + self.single_to_pair_q(F.relu(c)).view(nb, WINDOW_QUERIES, 1, -1)
        p = p + window_keys(self.single_to_pair_k(F.relu(c_ext)), windows)[:, None]
        return p + self.pair_mlp(p)


class AtomTransformerBlock(nn.Module):
    """Conditioned attention over 32 x 128 windows plus a conditioned transition."""

    def __init__(self, c_atom: int, c_atompair: int, heads: int) -> None:
        super().__init__()
        self.attention = ConditionedAttention(c_atom, c_atom, heads)
        self.pair_bias = NormedPairBias(c_atompair, heads)
        self.transition = ConditionedTransition(c_atom, c_atom)

    def forward(self, q: torch.Tensor, c: torch.Tensor, p_hat: torch.Tensor, mask_bias: torch.Tensor,
                windows: AtomWindows, layout: Layout) -> torch.Tensor:
        """``q: [S, A, c_atom]``, ``c: [A, c_atom]``, ``p_hat: [A/32, 32, 128, c_ap]``
        (normalised), ``mask_bias: [A/32, 1, 1, 128]``. Returns ``[S, A, c_atom]``."""
        n_samples, a, _ = q.shape
        nb = windows.n_windows
        qh, k, v, g = self.attention.project(q, c)  # [S, A, h, d]
        h, d = qh.shape[-2:]
        kv = torch.cat([k, v], dim=-1).movedim(1, 0).contiguous()  # [A, S, h, 2d]
        kv = window_keys(halo_extend(kv, layout), windows)  # [nb, 128, S, h, 2d]
        k, v = kv.permute(2, 0, 3, 1, 4).chunk(2, dim=-1)  # [S, nb, h, 128, d]
        bias = self.pair_bias(p_hat).permute(0, 3, 1, 2) + mask_bias  # [nb, h, 32, 128]
        o = F.scaled_dot_product_attention(
            qh.view(n_samples, nb, WINDOW_QUERIES, h, d).transpose(2, 3), k, v, attn_mask=bias.to(q.dtype))
        o = o.transpose(2, 3).reshape(n_samples, a, h, d)
        q = q + self.attention.finish(o, g, c)
        return q + self.transition(q, c)


class AtomTransformer(nn.Module):
    """AF3 Alg. 7: ``blocks`` windowed atom transformer blocks, ``heads`` heads."""

    def __init__(self, c_atom: int, c_atompair: int, blocks: int, heads: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(AtomTransformerBlock(c_atom, c_atompair, heads) for _ in range(blocks))

    def forward(self, q: torch.Tensor, c: torch.Tensor, p_hat: torch.Tensor, mask_bias: torch.Tensor,
                windows: AtomWindows, layout: Layout) -> torch.Tensor:
        """Shapes as ``AtomTransformerBlock.forward``."""
        for block in self.blocks:
            q = block(q, c, p_hat, mask_bias, windows, layout)
        return q
