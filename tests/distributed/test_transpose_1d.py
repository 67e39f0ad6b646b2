"""The 1d pair transpose on gloo ranks, against the transpose of the whole pair tensor, on fresh
random inputs: without autograd along both of its paths (the whole-shard exchange when the budget
holds one more shard, in place in channel chunks when it does not), from row-major input and from
the strided view the whole-shard path returns (two transposes in a row: back to Z), and with
autograd (values and the gradient, the reverse exchange)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from cpbench.models.pairformer.parallel import chunking
from cpbench.models.pairformer.parallel.layout import ONE_D, Layout
from cpbench.models.pairformer.parallel.transpose import transpose_pair
from tests.helpers.dist import run_distributed

N_PER_RANK, C = 6, 8


def _transposes(rank: int, world: int, seed: int, budget: str) -> dict:
    layout = Layout(ONE_D, dist.group.WORLD, rank, world)
    n = N_PER_RANK * world
    g = torch.Generator().manual_seed(seed)
    z_full = torch.randn(n, n, C, generator=g)
    rows = slice(rank * N_PER_RANK, (rank + 1) * N_PER_RANK)
    z = z_full[rows].clone()
    z_bytes = z.numel() * z.element_size()
    budget_b = 1 << 30 if budget == "whole" else z_bytes // 4
    out: dict = {}
    with torch.no_grad(), chunking.override_budget(budget_b):
        work = z.clone()
        zt = transpose_pair(work, layout)
        out["zt_err"] = float((zt - z_full.transpose(0, 1)[rows]).abs().max())
        out["zt_in_z_storage"] = zt.data_ptr() == work.data_ptr()
        out["zt_contiguous"] = zt.is_contiguous()
        back = transpose_pair(zt, layout)
        out["back_err"] = float((back - z).abs().max())
        out["back_in_zt_storage"] = back.data_ptr() == zt.data_ptr()
        out["back_contiguous"] = back.is_contiguous()
    leaf = z.clone().requires_grad_()
    weight = torch.randn(leaf.shape, generator=g)
    zt_grad = transpose_pair(leaf, layout)
    (zt_grad * weight).sum().backward()
    out["autograd_err"] = float((zt_grad.detach() - z_full.transpose(0, 1)[rows]).abs().max())
    # d/dZ of sum(W_r · (Z^T)_r) over ranks is the transpose of W's rows: gather W to check it.
    weights = [torch.empty_like(weight) for _ in range(world)]
    dist.all_gather(weights, weight)
    w_full = torch.cat(weights)
    out["grad_err"] = float((leaf.grad - w_full.transpose(0, 1)[rows]).abs().max())
    return out


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("budget", ["whole", "chunked"])
def test_the_1d_transpose_matches_the_whole_pair_tensor(world, budget):
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    for rank, r in enumerate(run_distributed(_transposes, world, args=(seed, budget))):
        context = (world, budget, rank, seed)
        assert r["zt_err"] == 0.0 and r["back_err"] == 0.0, (r, context)
        assert r["autograd_err"] == 0.0 and r["grad_err"] < 1e-6, (r, context)
        # both paths keep the result in the input's storage (no shard-sized result buffer)
        assert r["zt_in_z_storage"] and r["back_in_zt_storage"], (r, context)
        # the whole-shard path hands on a strided view first, then returns to row-major
        assert r["zt_contiguous"] == (budget == "chunked") and r["back_contiguous"], (r, context)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_block_permutations_copy_as_words_where_the_views_allow_it(dtype):
    """The transposes' strided copies (``_copy_words_``): bit-exact against ``copy_``; as 8-byte
    words for the shard's block permutation and element transpose, as they are for a view whose
    channels do not align with a word (an odd channel slice)."""
    from cpbench.models.pairformer.parallel.transpose import _copy_words_, _packed, _wordable

    n, p, c = 6, 3, 8
    z = torch.randn(n, p * n, c).to(dtype)
    ratio = 8 // z.element_size()
    blocks = z.view(n, p, n, c).permute(1, 0, 2, 3)  # the row-major transpose's send
    assert _wordable(blocks, ratio) and torch.equal(_packed(blocks), blocks.contiguous())
    landed = z.view(p, n, n, c)
    out = torch.empty(n, p, n, c, dtype=dtype)
    assert torch.equal(_copy_words_(out, landed.permute(1, 0, 2, 3)), landed.permute(1, 0, 2, 3))
    odd = z[..., 1:6]  # 5 channels from channel 1: no word boundary fits
    assert not _wordable(odd, ratio)
    dst = torch.empty(odd.shape, dtype=dtype)
    assert torch.equal(_copy_words_(dst, odd.transpose(0, 1).transpose(0, 1)), odd)
