"""Padding and sharding of features keeps the token, atom and MSA axes consistent on every rank."""

import pytest
import torch

from cpbench.data.sharding import (
    ATOM_WINDOW_QUERIES,
    atom_range,
    pad_features,
    shard_features,
    token_range,
    units_for_mesh,
)
from cpbench.data.synthetic import FEATURE_SPEC, make_synthetic_features


def _features(N, n_atoms, S=3, seed=0):
    return make_synthetic_features(N, n_atoms, S, torch.Generator().manual_seed(seed))


def _check_shard_holds_exactly_its_tokens_atoms(features, padded, layout, part, parts):
    local = shard_features(padded, layout, part, parts)
    t0, t1 = token_range(layout, part, parts)
    a0, a1 = atom_range(layout, part, parts)
    assert (a1 - a0) % ATOM_WINDOW_QUERIES == 0
    assert local["token_mask"].shape == (t1 - t0,) and local["atom_mask"].shape == (a1 - a0,)
    assert local["msa"].shape == (features["msa"].shape[0], t1 - t0)
    # the real atoms held here are exactly the original atoms of the tokens held here, in order
    orig = features["atom_to_token"]
    mine = (orig >= t0) & (orig < t1) & features["atom_mask"]
    held = local["atom_mask"]
    assert local["atom_to_token"][held].equal(orig[mine])
    assert local["ref_pos"][held].equal(features["ref_pos"][mine])
    assert local["ref_atom_name_chars"][held].equal(features["ref_atom_name_chars"][mine])
    # every atom (padding included) points at a local token
    assert local["atom_to_token_local"].min() >= 0 and local["atom_to_token_local"].max() < t1 - t0
    # padding tokens are masked everywhere
    n = features["token_mask"].numel()
    pad_tok = torch.arange(t0, t1) >= n
    assert not local["token_mask"][pad_tok].any() and not local["msa_mask"][:, pad_tok].any()
    return local


@pytest.mark.parametrize("P, N, n_atoms", [(1, 37, 300), (2, 37, 300), (3, 100, 777), (4, 61, 61 * 9)])
def test_1d_shards_hold_exactly_their_tokens_atoms(P, N, n_atoms):
    features = _features(N, n_atoms)
    padded, layout = pad_features(features, units_for_mesh((P,)))
    assert layout.n_tokens_padded % P == 0 and layout.n_tokens_padded >= N
    assert layout.n_atoms_padded == P * layout.atom_block and layout.atom_block % 32 == 0
    locals_ = [_check_shard_holds_exactly_its_tokens_atoms(features, padded, layout, p, P) for p in range(P)]
    # the shards together are the whole example, and unpadding gives it back
    assert sum(int(local["atom_mask"].sum()) for local in locals_) == int(features["atom_mask"].sum())
    for key, spec in FEATURE_SPEC.items():
        if "N" in spec.shape:
            dim = spec.shape.index("N")
            assert padded[key].narrow(dim, 0, N).equal(features[key]), key


@pytest.mark.parametrize("mesh", [(2, 2), (2, 3), (1, 4)])
def test_2d_rows_and_columns_slice_one_layout_consistently(mesh):
    cp0, cp1 = mesh
    features = _features(53, 53 * 7)
    padded, layout = pad_features(features, units_for_mesh(mesh), token_multiple=cp0 * cp1)
    assert layout.n_tokens_padded % (cp0 * cp1) == 0
    for parts in (cp0, cp1):  # pair rows over cp0, pair columns over cp1
        for p in range(parts):
            _check_shard_holds_exactly_its_tokens_atoms(features, padded, layout, p, parts)


def test_padding_atoms_are_masked_and_point_into_their_own_block():
    features = _features(10, 200)
    padded, layout = pad_features(features, units=4)
    a2t = padded["atom_to_token"]
    block_of_atom = torch.arange(layout.n_atoms_padded) // layout.atom_block
    assert (a2t // layout.token_block).equal(block_of_atom)
    assert int(padded["atom_mask"].sum()) == int(features["atom_mask"].sum())
    assert padded["token_index"].equal(torch.arange(layout.n_tokens_padded))


def test_shard_count_must_divide_layout_units():
    padded, layout = pad_features(_features(16, 64), units=4)
    with pytest.raises(ValueError, match="3 shards"):
        shard_features(padded, layout, 0, 3)


def test_unsorted_atom_to_token_is_rejected():
    features = _features(16, 64)
    features["atom_to_token"] = features["atom_to_token"].flip(0)
    with pytest.raises(ValueError, match="non-decreasing"):
        pad_features(features, units=2)


def test_msa_of_a_column_range_cannot_be_padded_as_a_global_one():
    features = make_synthetic_features(40, 160, 4, torch.Generator().manual_seed(0), msa_columns=(0, 20))
    with pytest.raises(ValueError, match="'msa' has 20 tokens"):
        pad_features(features, units=2)
