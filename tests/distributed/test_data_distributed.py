"""On real gloo ranks, every rank rebuilds the same seeded example and its shards tile it."""

import torch
import torch.nn.functional as F

from cpbench.data.sharding import pad_features, shard_features, token_range, units_for_mesh
from cpbench.data.synthetic import MSA_KEYS, make_synthetic_features
from cpbench.data.vocab import GAP_INDEX

from helpers.dist import run_distributed

N, N_ATOMS, S, SEED = 301, 2400, 6, 5  # N not divisible by the world size


def _rank_shard(rank: int, world_size: int) -> dict:
    feats = make_synthetic_features(N, N_ATOMS, S, torch.Generator().manual_seed(SEED))
    padded, layout = pad_features(feats, units_for_mesh((world_size,)))
    local = shard_features(padded, layout, rank, world_size)
    # the rank's MSA columns alone, generated without the global MSA, padded to its token range
    a, b = token_range(layout, rank, world_size)
    own = make_synthetic_features(N, N_ATOMS, S, torch.Generator().manual_seed(SEED), msa_columns=(min(a, N), min(b, N)))
    pad = b - min(b, N)
    local["own_msa"] = F.pad(own["msa"], (0, pad), value=GAP_INDEX)
    local["own_msa_mask"] = F.pad(own["msa_mask"], (0, pad))
    # numpy pickles by value; a torch tensor would be shared memory owned by the exiting worker
    return {k: v.numpy() for k, v in local.items()}


def test_ranks_rebuild_one_example_and_their_shards_tile_it():
    world_size = 2
    shards = [{k: torch.from_numpy(v) for k, v in s.items()} for s in run_distributed(_rank_shard, world_size, timeout_s=120)]
    feats = make_synthetic_features(N, N_ATOMS, S, torch.Generator().manual_seed(SEED))
    padded, layout = pad_features(feats, units_for_mesh((world_size,)))
    for key in padded:
        dim = -1 if key in MSA_KEYS else 0
        assert torch.cat([s[key] for s in shards], dim=dim).equal(padded[key]), key
    for s in shards:
        assert s["own_msa"].equal(s["msa"]) and s["own_msa_mask"].equal(s["msa_mask"])
