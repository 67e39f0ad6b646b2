"""LayerNorm in pieces: above ``MAX_ELEMENTS`` an eager call runs over pieces of its leading
dimension (CUDA's vectorized kernel is wrong from 2**32 elements: pytorch/pytorch issue 181555); the result and
every gradient must equal one whole ``F.layer_norm``. The limit is lowered so a CPU tensor
crosses it."""

import torch
import torch.nn.functional as F

from cpbench.models.pairformer.ops import layer_norm as ln


def test_pieces_give_the_whole_call_forward_and_backward(monkeypatch):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 5, 16, generator=g)
    w, b = torch.randn(16, generator=g), torch.randn(16, generator=g)
    monkeypatch.setattr(ln, "MAX_ELEMENTS", 2 * 5 * 16)  # pieces of 2 leading rows, the last of 1
    with torch.no_grad():
        torch.testing.assert_close(ln.layer_norm(x, (16,), w, b), F.layer_norm(x, (16,), w, b))

    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    out = ln.layer_norm(leaves[0], (16,), leaves[1], leaves[2])
    (out * torch.randn(out.shape, generator=g.manual_seed(4))).sum().backward()
    refs = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = F.layer_norm(refs[0], (16,), refs[1], refs[2])
    (ref * torch.randn(ref.shape, generator=g.manual_seed(4))).sum().backward()
    torch.testing.assert_close(out, ref)
    for got, want in zip(leaves, refs):
        torch.testing.assert_close(got.grad, want.grad)


def test_the_module_keeps_nn_layernorm_parameters(monkeypatch):
    torch.manual_seed(0)
    ours, theirs = ln.LayerNorm(8, bias=False), torch.nn.LayerNorm(8, bias=False)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(9, 3, 8)
    monkeypatch.setattr(ln, "MAX_ELEMENTS", 24)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x))
