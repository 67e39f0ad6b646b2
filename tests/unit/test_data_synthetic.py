"""Synthetic features follow the inventory contract (FEATURE_SPEC): shapes, dtypes, masks, seeds."""

import pytest
import torch

from cpbench.data.synthetic import FEATURE_SPEC, MSA_BLOCK_COLS, make_synthetic_features
from cpbench.data.vocab import GAP_INDEX, NUM_RESTYPES


def _features(N, n_atoms, S, seed=0, **kw):
    return make_synthetic_features(N, n_atoms, S, torch.Generator().manual_seed(seed), **kw)


@pytest.mark.parametrize("N, n_atoms, S", [(1, 1, 1), (37, 300, 5), (300, 2400, 40)])
def test_synthetic_features_match_feature_spec(N, n_atoms, S):
    f = _features(N, n_atoms, S)
    assert set(f) == set(FEATURE_SPEC)
    sizes = {"N": N, "N_atoms": n_atoms, "S": S}
    for key, spec in FEATURE_SPEC.items():
        assert f[key].dtype == spec.dtype, key
        assert tuple(f[key].shape) == tuple(sizes.get(d, d) for d in spec.shape), key


def test_every_small_size_gives_consistent_features():
    for N in [*range(1, 70), 97, 129]:  # every chain-count regime, odd and even
        n_atoms = N + (N * 5) // 3
        f = _features(N, n_atoms, 1 + N % 5, seed=N)
        assert f["atom_to_token"].shape == (n_atoms,) and f["msa"].shape == (1 + N % 5, N)
        counts = torch.bincount(f["atom_to_token"][f["atom_mask"]], minlength=N)
        assert (counts[f["token_mask"]] >= 1).all(), N
        assert f["token_mask"].any() and f["atom_mask"].any()


def test_synthetic_masks_are_neither_all_on_nor_all_off():
    f = _features(200, 1600, 32)
    for key in ("token_mask", "atom_mask", "msa_mask"):
        assert 0 < int(f[key].sum()) < f[key].numel(), key
    # crop padding sits at the tail of the token axis and the bottom of the MSA
    n_real = int(f["token_mask"].sum())
    assert f["token_mask"][:n_real].all() and not f["token_mask"][n_real:].any()
    assert f["msa_mask"][0, :n_real].all() and not f["msa_mask"][-1].any()


def test_atom_to_token_is_sorted_and_every_real_token_has_an_atom():
    N, n_atoms = 257, 2056
    f = _features(N, n_atoms, 4)
    a2t = f["atom_to_token"]
    assert (a2t[1:] >= a2t[:-1]).all() and a2t.min() >= 0 and a2t.max() < N
    counts = torch.bincount(a2t[f["atom_mask"]], minlength=N)
    assert (counts[f["token_mask"]] >= 1).all()
    assert (counts[~f["token_mask"]] == 0).all()  # real atoms belong to real tokens only
    # spread around n_atoms / N, not all on a few tokens
    real_counts = counts[f["token_mask"]].float()
    assert real_counts.std() > 0 and abs(real_counts.mean() - n_atoms / N) < 1.0
    assert f["ref_space_uid"].equal(a2t)


def test_token_features_describe_chains_and_a_homodimer():
    f = _features(128, 1024, 4)
    real = f["token_mask"]
    asym, entity, sym = f["asym_id"][real], f["entity_id"][real], f["sym_id"][real]
    assert asym.unique().numel() >= 2
    a, b = f["res_type"][real][asym == 0], f["res_type"][real][asym == 1]
    assert entity[asym == 0].unique().tolist() == entity[asym == 1].unique().tolist()
    assert sym[asym == 1].unique().tolist() == [1] and a.equal(b)
    for chain in asym.unique():
        idx = f["residue_index"][real][asym == chain]
        assert idx.equal(torch.arange(len(idx)))
    assert f["token_index"].equal(torch.arange(128))


def test_msa_query_row_profile_and_deletions_are_consistent():
    f = _features(90, 720, 48)
    real = f["token_mask"]
    assert f["msa"][0, real].equal(f["res_type"][real])
    assert f["msa"].min() >= 0 and f["msa"].max() < NUM_RESTYPES
    assert (f["msa"][~f["msa_mask"]] == GAP_INDEX).all()
    assert torch.allclose(f["profile"][real].sum(-1), torch.ones(int(real.sum())))
    assert (f["profile"][~real] == 0).all()
    assert f["has_deletion"].any() and f["has_deletion"].equal(f["deletion_value"] > 0)
    assert (f["deletion_value"] < 1).all() and (f["deletion_mean"] >= 0).all()


def test_same_seed_same_features_other_seed_differs():
    f1, f2, f3 = _features(64, 512, 8, seed=3), _features(64, 512, 8, seed=3), _features(64, 512, 8, seed=4)
    assert all(f1[k].equal(f2[k]) for k in f1)
    assert not f1["res_type"].equal(f3["res_type"]) and not f1["ref_pos"].equal(f3["ref_pos"])


def test_msa_column_slice_equals_slice_of_global_msa():
    N = 2 * MSA_BLOCK_COLS + 77
    full = _features(N, 4 * N, 6, seed=11)
    for a, b in [(0, N), (100, 300), (MSA_BLOCK_COLS, 2 * MSA_BLOCK_COLS + 5), (50, 50)]:
        part = _features(N, 4 * N, 6, seed=11, msa_columns=(a, b))
        for key in ("msa", "has_deletion", "deletion_value", "msa_mask"):
            assert part[key].equal(full[key][:, a:b]), (key, a, b)
        assert part["profile"].equal(full["profile"][a:b]) and part["deletion_mean"].equal(full["deletion_mean"][a:b])
        assert part["atom_to_token"].equal(full["atom_to_token"])


def test_too_few_atoms_is_a_clear_error():
    with pytest.raises(ValueError, match="n_atoms=10"):
        _features(64, 10, 4)
