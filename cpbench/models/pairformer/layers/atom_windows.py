"""Sequence-local atom windows (AF3 atom attention: 32 queries x 128 keys), as index tables.

Windows are laid over the *real* atoms (``atom_mask`` True) in their order, not over padded
slots: query block ``b`` is real atoms ``[32b, 32b+32)``, its keys are real atoms
``[32b-48, 32b+80)`` (AF3's key window, centred on the query block). The padded layout of
``cpbench.data.sharding`` moves atoms to other slots at every cp (each rank's block is padded
to 32), but never changes which atoms are real nor their order, so the windows, and with
them the encoder's output, are the same at every cp and topology.

A rank owns the atoms of its tokens (one contiguous slot range ``local``); its windows are
the query blocks holding at least one of its real atoms. A block that straddles two ranks is
computed on both, each for its own queries (the other slots are -1), so every real atom is the
query of exactly one window slot over all ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QUERIES, KEYS = 32, 128
KEY_OFFSET = (KEYS - QUERIES) // 2  # 48 keys before the query block, 48 after


@dataclass(frozen=True)
class AtomWindows:
    """Index tables of a rank's windows (``W`` windows).

    Attributes:
        query: ``[W, 32]`` int64, local atom slot of each query (index into ``local``), -1 if none.
        key: ``[W, 128]`` int64, global padded atom slot of each key, -1 if none.
    """

    query: torch.Tensor
    key: torch.Tensor

    @property
    def count(self) -> int:
        return self.query.shape[0]

    def slice(self, ws: slice) -> "AtomWindows":
        return AtomWindows(self.query[ws], self.key[ws])


def atom_windows(atom_mask: torch.Tensor, local: slice) -> AtomWindows:
    """The windows whose queries include real atoms in the slot range ``local``.

    Args:
        atom_mask: ``[N_atoms_pad]`` bool, global (every rank holds it).
        local: this rank's padded atom slots ``[a0, a1)``.
    Returns:
        ``AtomWindows`` with ``W`` = number of query blocks touching the local real atoms. A
        rank without real atoms (only padding tokens) gets one window with no query and no
        key: it runs the same ops as its peers, so every parameter has a gradient on every
        rank (the flat gradient all-reduce needs the same set everywhere).
    """
    device = atom_mask.device
    real_slots = atom_mask.nonzero().squeeze(1)  # [n_real] global slot of real atom v
    n_real = real_slots.numel()
    v0 = int((real_slots < local.start).sum())
    v1 = int((real_slots < local.stop).sum())
    if v1 == v0:
        return AtomWindows(torch.full((1, QUERIES), -1, device=device), torch.full((1, KEYS), -1, device=device))
    blocks = torch.arange(v0 // QUERIES, (v1 - 1) // QUERIES + 1, device=device)
    qv = blocks[:, None] * QUERIES + torch.arange(QUERIES, device=device)
    query = torch.where((qv >= v0) & (qv < v1), real_slots[qv.clamp(max=n_real - 1)] - local.start, -1)
    kv = blocks[:, None] * QUERIES - KEY_OFFSET + torch.arange(KEYS, device=device)
    key = torch.where((kv >= 0) & (kv < n_real), real_slots[kv.clamp(0, n_real - 1)], -1)
    return AtomWindows(query, key)
