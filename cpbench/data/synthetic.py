"""Synthetic input features at (N, N_atoms, S) by the AF3 / Boltz feature inventory, seeded.

The features are global (unsharded); ``cpbench.data.sharding`` pads and slices them per rank.
Token features are O(N) and cheap: every rank generates them and keeps its slice. The MSA is
O(S*N); ``msa_columns=(a, b)`` generates only columns ``[a, b)`` of it, bit-identical to the
same slice of the global MSA, so a rank never holds more MSA than its shard.

Layout of one synthetic example (what a cropped, padded AF3 training example looks like):

* tokens ``[0, N_real)`` are real protein residues in 1-4 chains (chains 0 and 1 are two
  copies of one entity, a homodimer); tokens ``[N_real, N)`` are crop padding
  (``token_mask`` False, a few percent of N, none when N == 1);
* atoms are sorted by token (``atom_to_token`` is non-decreasing); every real token has >= 1
  atom, counts spread around N_atoms / N; a few padding atoms (``atom_mask`` False) belong to
  the padding tokens;
* MSA row 0 is the query (``msa[0] == res_type`` on real tokens); the last few rows are
  padding (``msa_mask`` False), as are the padding tokens' columns.

Usage::

    g = torch.Generator().manual_seed(0)
    f = make_synthetic_features(N=384, n_atoms=3072, S=64, generator=g)
    f["atom_to_token"]  # [3072] int64, token of each atom
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cpbench.data.vocab import GAP_INDEX, MOL_PROTEIN, NUM_AMINO_ACIDS, NUM_RESTYPES

# Columns per independently seeded MSA block: a column slice regenerates only its blocks.
MSA_BLOCK_COLS = 256
NUM_ELEMENTS = 128  # AF3 ref_element one-hot width (index = atomic number)
NUM_NAME_CHARS = 64  # AF3 ref_atom_name_chars: 4 characters, each ord(c) - 32 in [0, 64)


@dataclass(frozen=True)
class FeatureSpec:
    """One feature: symbolic shape (``"N"`` tokens, ``"N_atoms"`` atoms, ``"S"`` MSA rows,
    ints literal), dtype, meaning. ``pad`` is the value on padding positions."""

    shape: tuple[str | int, ...]
    dtype: torch.dtype
    doc: str


FEATURE_SPEC: dict[str, FeatureSpec] = {
    # token features
    "res_type": FeatureSpec(("N",), torch.int64, "AF3 residue class in [0, 32) (vocab.RESTYPES)"),
    "residue_index": FeatureSpec(("N",), torch.int64, "residue number within its chain, from 0"),
    "token_index": FeatureSpec(("N",), torch.int64, "token number, 0..N-1 (global)"),
    "asym_id": FeatureSpec(("N",), torch.int64, "chain id, unique per chain"),
    "entity_id": FeatureSpec(("N",), torch.int64, "entity id, shared by identical chains"),
    "sym_id": FeatureSpec(("N",), torch.int64, "copy number of the chain within its entity"),
    "mol_type": FeatureSpec(("N",), torch.int64, "0 protein, 1 DNA, 2 RNA, 3 ligand"),
    "token_mask": FeatureSpec(("N",), torch.bool, "True on real tokens; pair mask = outer product"),
    # atom features
    "ref_pos": FeatureSpec(("N_atoms", 3), torch.float32, "reference conformer position (Angstrom)"),
    "ref_element": FeatureSpec(("N_atoms",), torch.int64, "atomic number in [0, 128)"),
    "ref_charge": FeatureSpec(("N_atoms",), torch.float32, "formal charge"),
    "ref_atom_name_chars": FeatureSpec(("N_atoms", 4), torch.int64, "atom name, ord(c) - 32 in [0, 64)"),
    "ref_space_uid": FeatureSpec(("N_atoms",), torch.int64, "reference conformer id (one per residue)"),
    "atom_mask": FeatureSpec(("N_atoms",), torch.bool, "True on real atoms"),
    "atom_to_token": FeatureSpec(("N_atoms",), torch.int64, "token of each atom, non-decreasing"),
    # MSA features
    "msa": FeatureSpec(("S", "N"), torch.int64, "residue class in [0, 32); row 0 is the query"),
    "has_deletion": FeatureSpec(("S", "N"), torch.bool, "a deletion precedes this position"),
    "deletion_value": FeatureSpec(("S", "N"), torch.float32, "2/pi * arctan(deletions / 3)"),
    "msa_mask": FeatureSpec(("S", "N"), torch.bool, "True on real rows of real tokens"),
    "profile": FeatureSpec(("N", NUM_RESTYPES), torch.float32, "residue class distribution over real rows"),
    "deletion_mean": FeatureSpec(("N",), torch.float32, "mean deletion count over real rows"),
}
TOKEN_KEYS = tuple(k for k, s in FEATURE_SPEC.items() if s.shape[0] == "N")
ATOM_KEYS = tuple(k for k, s in FEATURE_SPEC.items() if s.shape[0] == "N_atoms")
MSA_KEYS = tuple(k for k, s in FEATURE_SPEC.items() if s.shape[0] == "S")


def num_padding_tokens(N: int) -> int:
    """Crop-padding tokens at the tail of a synthetic example: ~3 % of N, >= 1 unless N == 1."""
    return 0 if N < 2 else min(N - 1, max(1, N // 32))


def num_padding_rows(S: int) -> int:
    """Padding MSA rows at the bottom: ~6 % of S, >= 1 unless S == 1 (the query is never padding)."""
    return 0 if S < 2 else min(S - 1, max(1, S // 16))


def spread_counts(total: int, parts: int, minimum: int, generator: torch.Generator) -> torch.Tensor:
    """``parts`` integers >= ``minimum`` summing to ``total``, spread around ``total / parts``.

    Returns: ``[parts]`` int64.
    """
    if parts == 0 and total == 0:
        return torch.zeros(0, dtype=torch.int64)
    extra = total - minimum * parts
    if extra < 0 or parts == 0:
        raise ValueError(f"cannot split {total} into {parts} parts of at least {minimum}")
    weights = 0.5 + torch.rand(parts, generator=generator, dtype=torch.float64)  # U(0.5, 1.5)
    share = torch.floor(extra * weights / weights.sum()).to(torch.int64)
    leftover = extra - int(share.sum())
    share[torch.randperm(parts, generator=generator)[:leftover]] += 1
    return share + minimum


def make_synthetic_features(
    N: int,
    n_atoms: int,
    S: int,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    msa_columns: tuple[int, int] | None = None,
) -> dict[str, torch.Tensor]:
    """Global synthetic features of one example (see ``FEATURE_SPEC`` for every key).

    Args:
        N: tokens (>= 1).
        n_atoms: atoms (>= the real tokens, N - num_padding_tokens(N)).
        S: MSA rows including the query (>= 1).
        generator: a CPU ``torch.Generator``; the same seed gives the same features.
        device: where the returned tensors live (generated on the CPU).
        msa_columns: ``(a, b)`` to generate only MSA columns ``[a, b)`` (all when None).

    Returns:
        token features ``res_type, residue_index, token_index, asym_id, entity_id, sym_id,
        mol_type``: ``[N]`` int64; ``token_mask``: ``[N]`` bool; ``profile``: ``[N, 32]``
        float32 and ``deletion_mean``: ``[N]`` float32 (columns ``[a, b)`` only when
        ``msa_columns`` is set: ``[b-a, 32]``, ``[b-a]``);
        atom features ``ref_pos``: ``[N_atoms, 3]`` float32, ``ref_element``,
        ``ref_space_uid``, ``atom_to_token``: ``[N_atoms]`` int64, ``ref_charge``:
        ``[N_atoms]`` float32, ``ref_atom_name_chars``: ``[N_atoms, 4]`` int64, ``atom_mask``:
        ``[N_atoms]`` bool;
        MSA features ``msa``: ``[S, N]`` int64, ``has_deletion``, ``msa_mask``: ``[S, N]`` bool,
        ``deletion_value``: ``[S, N]`` float32 (``[S, b-a]`` with ``msa_columns``).
    """
    n_real = N - num_padding_tokens(N)
    if N < 1 or S < 1:
        raise ValueError(f"need N >= 1 and S >= 1, got N={N}, S={S}")
    if n_atoms < n_real:
        raise ValueError(f"n_atoms={n_atoms} < {n_real} real tokens: every real token needs an atom")
    features = _token_features(N, n_real, generator)
    features.update(_atom_features(N, n_real, n_atoms, generator))
    msa_seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    a, b = (0, N) if msa_columns is None else msa_columns
    if not 0 <= a <= b <= N:
        raise ValueError(f"msa_columns={msa_columns} outside [0, {N}]")
    features.update(_msa_features(features["res_type"], features["token_mask"], S, msa_seed, a, b))
    return {k: v.to(device) for k, v in features.items()}


def _token_features(N: int, n_real: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Chains: 1-4 of them over the real tokens; chains 0 and 1 are a homodimer."""
    n_chains = min(4, max(1, n_real // 16))
    if n_chains >= 2:
        dimer_len = n_real // n_chains
        if n_chains == 2 and n_real % 2:  # two equal copies cannot cover an odd count
            n_chains = 3
        rest = spread_counts(n_real - 2 * dimer_len, n_chains - 2, 1, g).tolist()
        lengths = [dimer_len, dimer_len] + rest
        entities = [0, 0] + list(range(1, n_chains - 1))
        syms = [0, 1] + [0] * (n_chains - 2)
    else:
        lengths, entities, syms = [n_real], [0], [0]
    chain_of = torch.repeat_interleave(torch.arange(n_chains), torch.tensor(lengths))
    res_type = torch.randint(0, NUM_AMINO_ACIDS, (n_real,), generator=g)
    if n_chains >= 2:  # the dimer's second copy has its first copy's sequence
        res_type[dimer_len : 2 * dimer_len] = res_type[:dimer_len]
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
    residue_index = torch.arange(n_real) - starts[chain_of]

    def padded(real: torch.Tensor, fill: int = 0) -> torch.Tensor:
        out = torch.full((N,), fill, dtype=torch.int64)
        out[:n_real] = real
        return out

    return {
        "res_type": padded(res_type),
        "residue_index": padded(residue_index),
        "token_index": torch.arange(N, dtype=torch.int64),
        "asym_id": padded(chain_of),
        "entity_id": padded(torch.tensor(entities)[chain_of]),
        "sym_id": padded(torch.tensor(syms)[chain_of]),
        "mol_type": padded(torch.full((n_real,), MOL_PROTEIN)),
        "token_mask": torch.arange(N) < n_real,
    }


def _atom_features(N: int, n_real: int, n_atoms: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Atoms sorted by token; padding atoms (if any) belong to the padding tokens."""
    n_pad_tokens = N - n_real
    n_pad_atoms = min(n_atoms - n_real, n_atoms // 64) if n_pad_tokens else 0
    counts = torch.cat([
        spread_counts(n_atoms - n_pad_atoms, n_real, 1, g),
        spread_counts(n_pad_atoms, n_pad_tokens, 0, g),
    ])
    atom_to_token = torch.repeat_interleave(torch.arange(N), counts)
    atom_mask = torch.arange(n_atoms) < n_atoms - n_pad_atoms
    # Element frequencies of protein heavy atoms: C, N, O, S.
    elements = torch.tensor([6, 7, 8, 16])
    element = elements[torch.multinomial(torch.tensor([0.62, 0.17, 0.19, 0.02]), n_atoms, True, generator=g)]
    charge = torch.zeros(n_atoms)
    charged = torch.rand(n_atoms, generator=g) < 0.02
    charge[charged] = torch.randint(0, 2, (int(charged.sum()),), generator=g).float() * 2 - 1
    # Atom names: a letter then up to three letters/digits/spaces, as ord(c) - 32.
    first = torch.randint(ord("A") - 32, ord("Z") - 32 + 1, (n_atoms, 1), generator=g)
    rest = torch.randint(0, NUM_NAME_CHARS, (n_atoms, 3), generator=g)
    name_chars = torch.cat([first, rest], dim=1)
    ref_pos = 1.5 * torch.randn(n_atoms, 3, generator=g)
    off = ~atom_mask
    element[off], charge[off], name_chars[off], ref_pos[off] = 0, 0.0, 0, 0.0
    return {
        "ref_pos": ref_pos,
        "ref_element": element,
        "ref_charge": charge,
        "ref_atom_name_chars": name_chars,
        "ref_space_uid": atom_to_token.clone(),  # one reference conformer per residue token
        "atom_mask": atom_mask,
        "atom_to_token": atom_to_token,
    }


def _msa_features(
    res_type: torch.Tensor, token_mask: torch.Tensor, S: int, seed: int, a: int, b: int
) -> dict[str, torch.Tensor]:
    """MSA columns ``[a, b)`` plus their profile and deletion mean, generated block by block.

    Each block of ``MSA_BLOCK_COLS`` columns has its own generator, so any column range
    regenerates exactly the global values.
    """
    row_real = torch.arange(S) < S - num_padding_rows(S)
    if b == a:  # an empty column range still has the right shapes
        return _msa_block(res_type[:0], token_mask[:0], row_real, torch.Generator().manual_seed(seed))
    blocks = []
    for block in range(a // MSA_BLOCK_COLS, (b - 1) // MSA_BLOCK_COLS + 1):
        lo, hi = block * MSA_BLOCK_COLS, min((block + 1) * MSA_BLOCK_COLS, len(res_type))
        g = torch.Generator().manual_seed((seed + 1_000_003 * block) % 2**63)
        full = _msa_block(res_type[lo:hi], token_mask[lo:hi], row_real, g)
        keep = slice(max(a, lo) - lo, min(b, hi) - lo)
        blocks.append({k: v[keep] if k == "profile" else v[..., keep] for k, v in full.items()})
    return {k: torch.cat([blk[k] for blk in blocks], dim=0 if k == "profile" else -1) for k in blocks[0]}


def _msa_block(
    res_type: torch.Tensor, token_mask: torch.Tensor, row_real: torch.Tensor, g: torch.Generator
) -> dict[str, torch.Tensor]:
    """One column block: ``res_type, token_mask: [n]``, ``row_real: [S]`` -> MSA ``[S, n]``."""
    S, n = len(row_real), len(res_type)
    msa = res_type.expand(S, n).clone()
    substituted = torch.rand(S, n, generator=g) < 0.3
    substituted[0] = False  # row 0 is the query
    msa[substituted] = torch.randint(0, NUM_AMINO_ACIDS, (int(substituted.sum()),), generator=g)
    gapped = torch.rand(S, n, generator=g) < 0.1
    gapped[0] = False
    msa[gapped] = GAP_INDEX
    deletions = torch.where(torch.rand(S, n, generator=g) < 0.05, torch.randint(1, 10, (S, n), generator=g), 0)
    deletions[0] = 0
    msa_mask = row_real[:, None] & token_mask[None, :]
    msa[~msa_mask] = GAP_INDEX
    deletions[~msa_mask] = 0
    real_rows = row_real.sum().clamp(min=1)
    # class counts per column without an [S, n, 32] one-hot
    real_msa = msa[row_real].t()  # [n, S_real]
    counts = torch.zeros(n, NUM_RESTYPES).scatter_add_(1, real_msa, torch.ones(real_msa.shape))
    profile = counts / real_rows * token_mask[:, None]
    return {
        "msa": msa,
        "has_deletion": deletions > 0,
        "deletion_value": (2 / math.pi) * torch.atan(deletions.to(torch.float32) / 3),
        "msa_mask": msa_mask,
        "profile": profile,
        "deletion_mean": deletions[row_real].to(torch.float32).sum(0) / real_rows * token_mask,
    }
