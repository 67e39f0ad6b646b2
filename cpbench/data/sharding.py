"""Padding and per-rank slicing of input features: the one place that shards the feature axes.

Conventions: we say *axis* for a DeviceMesh axis and *dim* for a tensor dimension. Features
are keyed as in ``cpbench.data.synthetic.FEATURE_SPEC``; their symbolic shapes say which dims
are the token axis (``"N"``, also the MSA columns) and the atom axis (``"N_atoms"``).

``pad_features`` lays the example out in ``units`` equal blocks, once, globally:

* the token axis is padded to ``N_pad``, a multiple of ``units`` (and of ``token_multiple``);
  unit block ``u`` holds tokens ``[u*tb, (u+1)*tb)`` with ``tb = N_pad / units``;
* the atom axis is regrouped into ``units`` blocks of ``atom_block`` atoms each (a multiple of
  32, AF3's atom-attention query window): block ``u`` holds exactly the atoms of the tokens of
  unit ``u``, in order, then padding atoms;
* ``atom_to_token`` indexes the padded token axis (padding tokens only append, so real indices
  are unchanged); a padding atom points at the last token of its own block, so a local
  scatter stays in range; padding tokens, atoms and MSA columns have their masks False.

Any shard count ``parts`` that divides ``units`` then slices tokens, atoms and MSA columns
consistently with ``shard_features``: rank ``p`` holding tokens ``[a, b)`` holds exactly their
atoms. Use ``units = units_for_mesh(mesh_shape)``: for 1d ``(P,)`` that is P; for a 2d
``(cp0, cp1)`` grid lcm(cp0, cp1), so rows (cp0 parts) and columns (cp1 parts) of the pair
tensor both slice the same layout.

For a large MSA, generate only a rank's columns (``make_synthetic_features(...,
msa_columns=(min(a, N), min(b, N)))`` with ``(a, b) = token_range(...)``) and pad the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cpbench.data.synthetic import FEATURE_SPEC
from cpbench.data.vocab import GAP_INDEX

ATOM_WINDOW_QUERIES = 32  # AF3 atom attention: 32 queries x 128 keys per window

# Value on padding positions; everything else pads with 0 (masks with False).
_PAD_VALUE = {"msa": GAP_INDEX}


@dataclass(frozen=True)
class PaddedLayout:
    """Where the padded example's blocks lie (global indices)."""

    units: int  # blocks of the token and atom axes; a shard count must divide it
    n_tokens: int  # N before padding
    n_tokens_padded: int  # N_pad, a multiple of units
    n_atoms: int  # N_atoms before padding
    atom_block: int  # atoms per unit block, a multiple of 32

    @property
    def token_block(self) -> int:
        return self.n_tokens_padded // self.units

    @property
    def n_atoms_padded(self) -> int:
        return self.units * self.atom_block


def units_for_mesh(mesh_shape: tuple[int, ...]) -> int:
    """The block count that every mesh axis (and the whole 1-D mesh) divides."""
    return math.lcm(*mesh_shape)


def padded_size(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (at least one multiple)."""
    return max(1, math.ceil(n / multiple)) * multiple


def token_range(layout: PaddedLayout, part: int, parts: int) -> tuple[int, int]:
    """Padded token indices ``[a, b)`` of shard ``part`` of ``parts``."""
    per = _units_per_part(layout, part, parts)
    return part * per * layout.token_block, (part + 1) * per * layout.token_block


def atom_range(layout: PaddedLayout, part: int, parts: int) -> tuple[int, int]:
    """Padded atom indices ``[a, b)`` of shard ``part`` of ``parts`` (a multiple of 32 long)."""
    per = _units_per_part(layout, part, parts)
    return part * per * layout.atom_block, (part + 1) * per * layout.atom_block


def _units_per_part(layout: PaddedLayout, part: int, parts: int) -> int:
    if parts < 1 or layout.units % parts:
        raise ValueError(f"{parts} shards do not divide the {layout.units} unit blocks of the layout")
    if not 0 <= part < parts:
        raise ValueError(f"shard {part} outside [0, {parts})")
    return layout.units // parts


def pad_features(
    features: dict[str, torch.Tensor],
    units: int,
    token_multiple: int = 1,
    atom_multiple: int = ATOM_WINDOW_QUERIES,
) -> tuple[dict[str, torch.Tensor], PaddedLayout]:
    """Pad the token axis and regroup the atom axis into ``units`` blocks (module docstring).

    Args:
        features: global features keyed as in ``FEATURE_SPEC`` (at least ``token_mask`` and
            ``atom_to_token``, non-decreasing): token dims ``[N, ...]``, atom dims
            ``[N_atoms, ...]``, MSA ``[S, N]``.
        units: blocks of the layout (``units_for_mesh(mesh_shape)``).
        token_multiple: N_pad is also a multiple of this (the topology's padding unit).
        atom_multiple: each atom block's length is a multiple of this.

    Returns:
        ``(padded, layout)``: the same keys with token dims ``[N_pad, ...]``, atom dims
        ``[units * atom_block, ...]``, MSA ``[S, N_pad]``.
    """
    unknown = set(features) - set(FEATURE_SPEC)
    if unknown:
        raise KeyError(f"no sharding rule for feature(s) {sorted(unknown)}; add them to FEATURE_SPEC")
    a2t, N = features["atom_to_token"], features["token_mask"].shape[0]
    for key, value in features.items():  # e.g. an MSA generated for a column range only
        dims = FEATURE_SPEC[key].shape
        if "N" in dims and value.shape[dims.index("N")] != N:
            raise ValueError(f"feature {key!r} has {value.shape[dims.index('N')]} tokens, token_mask has {N}")
    if a2t.numel() and (bool((a2t[1:] < a2t[:-1]).any()) or int(a2t.min()) < 0 or int(a2t.max()) >= N):
        raise ValueError("atom_to_token must be non-decreasing and index [0, N): atoms sorted by token")
    n_tokens_padded = padded_size(N, math.lcm(units, token_multiple))
    tb = n_tokens_padded // units
    bounds = torch.searchsorted(a2t, torch.arange(units + 1, device=a2t.device) * tb)
    counts = bounds[1:] - bounds[:-1]
    atom_block = padded_size(int(counts.max()) if a2t.numel() else 0, atom_multiple)
    layout = PaddedLayout(units, N, n_tokens_padded, a2t.numel(), atom_block)

    # source atom of every padded atom slot (-1: padding)
    slot = torch.arange(atom_block, device=a2t.device)
    src = bounds[:-1, None] + slot[None, :]
    src = torch.where(slot[None, :] < counts[:, None], src, -1).reshape(-1)
    real_slot = src >= 0
    block_last_token = (torch.arange(units, device=a2t.device) + 1) * tb - 1

    padded = {}
    for key, value in features.items():
        dims = FEATURE_SPEC[key].shape
        fill = _PAD_VALUE.get(key, 0)
        if "N_atoms" in dims:
            out = torch.full((layout.n_atoms_padded, *value.shape[1:]), fill, dtype=value.dtype, device=value.device)
            out[real_slot] = value[src[real_slot]]
            if key == "atom_to_token":
                out[~real_slot] = block_last_token.repeat_interleave(atom_block)[~real_slot]
        elif "N" in dims:
            dim = dims.index("N")
            shape = list(value.shape)
            shape[dim] = n_tokens_padded - N
            tail = torch.full(shape, fill, dtype=value.dtype, device=value.device)
            if key == "token_index":
                tail = torch.arange(N, n_tokens_padded, dtype=value.dtype, device=value.device)
            out = torch.cat([value, tail], dim=dim)
        else:
            out = value
        padded[key] = out
    return padded, layout


def shard_features(
    padded: dict[str, torch.Tensor], layout: PaddedLayout, part: int, parts: int
) -> dict[str, torch.Tensor]:
    """Shard ``part`` of ``parts`` of padded features: its tokens, their atoms, their MSA columns.

    Returns:
        token dims ``[N_pad/parts, ...]``, atom dims ``[N_atoms_pad/parts, ...]``, MSA
        ``[S, N_pad/parts]``; ``atom_to_token`` keeps the global padded token index and
        ``atom_to_token_local`` (``[N_atoms_pad/parts]`` int64) is it minus the shard's first
        token, in ``[0, N_pad/parts)``.
    """
    t0, t1 = token_range(layout, part, parts)
    a0, a1 = atom_range(layout, part, parts)
    local = {}
    for key, value in padded.items():
        dims = FEATURE_SPEC[key].shape
        if "N_atoms" in dims:
            local[key] = value.narrow(dims.index("N_atoms"), a0, a1 - a0)
        elif "N" in dims:
            local[key] = value.narrow(dims.index("N"), t0, t1 - t0)
        else:
            local[key] = value
    if "atom_to_token" in local:
        local["atom_to_token_local"] = local["atom_to_token"] - t0
    return local
