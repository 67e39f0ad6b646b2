"""The Triton passes under autograd (``ops/triton_backward.py``): every output and every gradient
(input, LayerNorm weight and bias, projection weights) against autograd through the eager
``torch`` functions of ``ops/fused.py``, on fresh random inputs, fp32, on the strided views the
autograd paths hand them (the transposed pair, the product's channel-first ``x``, row slices),
in Triton's interpreter on the CPU; the residual forms (the input plus the update, its gradient
summed in the backward kernel) against the eager ``x + update``; and the refusal of output buffers."""

from __future__ import annotations

import pytest
import torch

from cpbench.models.pairformer.ops import fused, triton_passes

pytestmark = pytest.mark.skipif(
    not triton_passes.HAS_TRITON or not (triton_passes.interpreted() or torch.cuda.is_available()),
    reason="Triton is not installed (pip install triton), or neither a GPU nor TRITON_INTERPRET=1")

from cpbench.models.pairformer.ops import triton_backward  # noqa: E402 -- imports Triton

DEVICE = "cuda" if torch.cuda.is_available() and not triton_passes.interpreted() else "cpu"
C = 32
R, N = 3, 37  # 111 rows: a partial last tile
TOL = dict(atol=5e-5, rtol=5e-5)


def leaf(*shape: int, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
    return (offset + scale * torch.randn(*shape, device=DEVICE)).requires_grad_()


def pair(transposed: bool) -> torch.Tensor:
    """``[R, N, C]`` rows of z needing a gradient; transposed: a ``[N, R, C]`` leaf's transposed view."""
    base = leaf(N, R, C) if transposed else leaf(R, N, C)
    return base.transpose(0, 1) if transposed else base


def ln_params(c: int = C) -> tuple[torch.Tensor, torch.Tensor]:
    return leaf(c, scale=0.3, offset=1.0), leaf(c, scale=0.3)


def weight(out: int, inp: int) -> torch.Tensor:
    return leaf(out, inp, scale=inp ** -0.5)


def assert_same_grads(triton_fn, torch_fn, inputs: list[torch.Tensor]) -> None:
    """Outputs and the gradients of every input that needs one, for one random output gradient."""
    got = triton_fn(*inputs)
    want = torch_fn(*inputs)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    cotangents = [torch.randn_like(w) for w in want]
    needs = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    g_got = torch.autograd.grad(got, needs, cotangents)
    g_want = torch.autograd.grad(want, needs, cotangents)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)
    for k, (a, b) in enumerate(zip(g_got, g_want)):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, k=k: f"gradient of input {k}: {m}")


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("out, ln_bias", [(4 * C, True), (4, True), (16, False)])
def test_norm_linear(transposed, out, ln_bias):
    z, (ln_w, ln_b), w = pair(transposed), ln_params(), weight(out, C)
    ln_b = ln_b if ln_bias else None
    assert_same_grads(triton_backward.norm_linear, fused.norm_linear, [z, ln_w, ln_b, w])


@pytest.mark.parametrize("rows_2d, acc", [(False, None), (True, None), (False, "rows"), (False, "transposed")])
def test_gated_output(rows_2d, acc):
    """``acc``: the triangle attention's residual, z's rows (or the transposed view of the Z^T op)."""
    k = 2 * C
    proj = leaf(R, N, 2 * k)  # o and g as views of one projection, as the attention hands them
    o, g = proj[..., :k], proj[..., k:]
    if rows_2d:
        o, g = o.reshape(R * N, k), g.reshape(R * N, k)
    inputs = [o, g, weight(C, k)] + ([] if acc is None else [pair(acc == "transposed")])
    assert_same_grads(triton_backward.gated_output, fused.gated_output, inputs)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_swiglu_transition(transposed, residual):
    x, (ln_w, ln_b) = pair(transposed), ln_params()
    assert_same_grads(triton_backward.swiglu_transition, fused.swiglu_transition,
                      [x, ln_w, ln_b, weight(8 * C, C), weight(C, 4 * C), residual])


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("k", [16, C])
def test_triangle_operands(transposed, k):
    z, (ln_w, ln_b) = pair(transposed), ln_params()
    mask = (torch.rand(R, N, device=DEVICE) > 0.2).float()
    assert_same_grads(triton_backward.triangle_operands, fused.triangle_operands, [z, ln_w, ln_b, weight(4 * k, C), mask])


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_triangle_update(transposed, residual):
    """``x`` as the product leaves it: a ``[c, R, N]`` leaf's ``permute(1, 2, 0)``."""
    x = leaf(C, R, N).permute(1, 2, 0)
    z, (lx_w, lx_b), (lz_w, lz_b) = pair(transposed), ln_params(), ln_params()
    assert_same_grads(triton_backward.triangle_update, fused.triangle_update,
                      [x, z, lx_w, lx_b, lz_w, lz_b, weight(C, C), weight(C, C), residual])


@pytest.mark.parametrize("residual", [False, True])
def test_residual_forms_leave_their_input_as_it_was(residual):
    """Under autograd a residual is out of place: the input (saved for backward) keeps its values."""
    x, (ln_w, ln_b) = pair(False), ln_params()
    before = x.detach().clone()
    out = triton_backward.swiglu_transition(x, ln_w, ln_b, weight(8 * C, C), weight(C, 4 * C), residual=residual)
    assert out.data_ptr() != x.data_ptr()
    torch.testing.assert_close(x.detach(), before, atol=0, rtol=0)


def test_output_buffers_are_refused():
    z, (ln_w, ln_b) = pair(False), ln_params()
    a_out, b_out = torch.empty(16, R, N), torch.empty(16, R, N)
    with pytest.raises(ValueError, match="out of place"):
        triton_backward.triangle_operands(z, ln_w, ln_b, weight(64, C), torch.ones(R, N), a_out, b_out)
