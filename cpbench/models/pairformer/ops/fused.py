"""The memory-bound passes around the pair ops, as functions that ``kernels.compiled`` fuses.

Under the ``torch`` backend each runs eagerly, op by op, exactly as the layers did inline;
under ``flex`` on CUDA each is one ``torch.compile`` region, so LayerNorm, the gating
sigmoids, SwiGLU and the masks fuse into a few passes over the rows instead of one pass per
op (the matmuls stay cuBLAS). Weights come in as arguments so one compiled function serves
every layer of its kind. Shapes are per rank; ``rows`` is any leading shape (``[r, N]`` of a
pair shard, ``[r]`` of a single shard), ``c`` the channels.

With ``residual=True`` (``acc``) a function returns its input plus its update: the lean
(no-autograd) paths add in place and return the input; under autograd the sum is a new tensor
(``_plus``). ``triangle_operands`` can write into given buffers (not under autograd).
Compiled, the add or the store is part of the last Triton pass (one pass fewer over z than an
eager ``+=`` or copy afterwards, and a strided store, where the eager add on a transposed view of
z, as the serial layout's Z^T ops get it, ran at less than half the contiguous add's speed on one
H200). Near the memory limit (``chunking.near_limit``) each public function here keeps the eager
add or copy after its compiled pass (the private ``_`` twin that ``kernels.compiled`` wraps).

Under ``model.passes=triton`` (``flex`` on CUDA: ``kernels.triton_passes``) each public function
runs its Triton kernel instead (``ops/triton_passes.py``: LayerNorm, projection, gates and the
residual add in one pass that reads z once, writing in place with no transient tensor), where the
shapes suit it (``triton_passes.usable``: power-of-two channels); otherwise the compiled region.
Under autograd (compiled training) the calls run the same kernels as autograd functions with a
Triton backward (``ops/triton_backward.py``), the residual forms included: the sum is written by the
op's own kernel and its gradient added in the backward kernel's epilogue, so that a residual costs no
pass over z of its own, forward or backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cpbench.models.pairformer.ops import kernels
from cpbench.models.pairformer.ops.layer_norm import layer_norm
from cpbench.models.pairformer.parallel import chunking


def _on_triton(x: torch.Tensor, *channels: int, buffers: bool = False) -> bool:
    """Whether ``x``'s pass runs as a Triton kernel (``model.passes=triton``, shapes it takes:
    ``[rows, c]`` or ``[r, N, c]``, ``channels`` each a size ``triton_passes.usable`` takes); under
    autograd only without output ``buffers``."""
    return (kernels.triton_passes(x) and x.dim() <= 3 and all(_tp().usable(x, c) for c in channels)
            and not (buffers and torch.is_grad_enabled()))


def _adds_after(x: torch.Tensor) -> bool:
    """Whether a residual form adds its update after the compiled region rather than inside it
    (``_plus``): under autograd (out of place) or near the memory limit (``chunking.near_limit``)."""
    return torch.is_grad_enabled() or chunking.near_limit(x)


def _plus(x: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """``x + update``: in place without autograd (``x`` returned), a new tensor under autograd
    (``x`` may be saved for backward)."""
    return x + update if torch.is_grad_enabled() else x.add_(update)


def _tp():
    """``ops/triton_passes.py``, imported at its first use (it imports Triton)."""
    from cpbench.models.pairformer.ops import triton_passes

    return triton_passes


def _triton():
    """The Triton kernels to call: ``ops/triton_passes.py``'s, or under autograd
    ``ops/triton_backward.py``'s (the same kernels as autograd functions, out of place only)."""
    if torch.is_grad_enabled():
        from cpbench.models.pairformer.ops import triton_backward

        return triton_backward
    return _tp()


def norm_linear(x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor | None, w: torch.Tensor) -> torch.Tensor:
    """``LayerNorm(x) @ wᵀ``: ``x: [rows, c]``, ``w: [out, c]`` -> ``[rows, out]``."""
    if _on_triton(x, x.shape[-1]):
        return _triton().norm_linear(x, ln_w, ln_b, w)
    return _norm_linear(x, ln_w, ln_b, w)


@kernels.compiled
def _norm_linear(x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor | None, w: torch.Tensor) -> torch.Tensor:
    return F.linear(layer_norm(x, (x.shape[-1],), ln_w, ln_b), w)


def swiglu_transition(x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w_in: torch.Tensor,
                      w_out: torch.Tensor, residual: bool = False) -> torch.Tensor:
    """The transition's update ``W_out(silu(a) * b)``, ``[a; b] = W_in LN(x)``: ``x: [rows, c]``;
    with ``residual``, ``x`` plus the update (``_plus``)."""
    if _on_triton(x, x.shape[-1]) and _tp().swiglu_hidden_ok(w_out.shape[1]):
        return _triton().swiglu_transition(x, ln_w, ln_b, w_in, w_out, residual)
    if residual and _adds_after(x):
        return _plus(x, _swiglu_transition(x, ln_w, ln_b, w_in, w_out, False))
    return _swiglu_transition(x, ln_w, ln_b, w_in, w_out, residual)


@kernels.compiled
def _swiglu_transition(x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w_in: torch.Tensor,
                       w_out: torch.Tensor, residual: bool) -> torch.Tensor:
    a, b = F.linear(layer_norm(x, (x.shape[-1],), ln_w, ln_b), w_in).chunk(2, dim=-1)
    update = F.linear(F.silu(a) * b, w_out)
    return x.add_(update) if residual else update


def gated_output(o: torch.Tensor, g: torch.Tensor, w_out: torch.Tensor,
                 acc: torch.Tensor | None = None) -> torch.Tensor:
    """``W_out(o * sigmoid(g))``: ``o, g: [rows, h·d]`` -> ``[rows, c]``; with ``acc: [rows, c]``,
    ``acc`` plus that (``_plus``)."""
    if _on_triton(o, o.shape[-1], w_out.shape[0]):
        return _triton().gated_output(o, g, w_out, acc)
    if acc is not None and _adds_after(acc):
        return _plus(acc, _gated_output(o, g, w_out, None))
    return _gated_output(o, g, w_out, acc)


@kernels.compiled
def _gated_output(o: torch.Tensor, g: torch.Tensor, w_out: torch.Tensor, acc: torch.Tensor | None) -> torch.Tensor:
    update = F.linear(o * torch.sigmoid(g), w_out)
    return update if acc is None else acc.add_(update)


def triangle_operands(z: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w: torch.Tensor,
                      mask: torch.Tensor, a_out: torch.Tensor | None = None,
                      b_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Triangle multiplication's gated, masked operands of rows ``z: [r, N, c_z]``.

    ``w: [4k, c_z]`` stacks the projections and gates of k channels of a and b; ``mask: [r, N]``.
    Returns ``(a, b)``, each ``[k, r, N]`` (channel-first: the layout the product batches over),
    written into ``a_out`` and ``b_out`` (views of the same shape, any strides) when given.
    """
    if _on_triton(z, z.shape[-1], buffers=a_out is not None) and _tp().operand_channels_ok(w.shape[0] // 4):
        return _triton().triangle_operands(z, ln_w, ln_b, w, mask, a_out, b_out)
    if a_out is not None and chunking.near_limit(z):
        a, b = _triangle_operands(z, ln_w, ln_b, w, mask, None, None)
        return a_out.copy_(a), b_out.copy_(b)
    return _triangle_operands(z, ln_w, ln_b, w, mask, a_out, b_out)


@kernels.compiled
def _triangle_operands(z: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w: torch.Tensor,
                       mask: torch.Tensor, a_out: torch.Tensor | None,
                       b_out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    r, n = z.shape[:2]
    zn = layer_norm(z, (z.shape[-1],), ln_w, ln_b)
    pa, pb, ga, gb = torch.matmul(w, zn.reshape(r * n, -1).t()).view(4, -1, r, n).unbind(0)
    a, b = pa * torch.sigmoid(ga) * mask, pb * torch.sigmoid(gb) * mask
    if a_out is None:
        return a, b
    return a_out.copy_(a), b_out.copy_(b)


def triangle_update(x: torch.Tensor, z: torch.Tensor, ln_x_w: torch.Tensor, ln_x_b: torch.Tensor,
                    ln_z_w: torch.Tensor, ln_z_b: torch.Tensor, w_out: torch.Tensor,
                    w_gate: torch.Tensor, residual: bool = False) -> torch.Tensor:
    """Triangle multiplication's output stage ``W_out LN(x) * sigmoid(W_g LN(z))``:
    ``x: [r, N, c]``, ``z: [r, N, c_z]`` -> ``[r, N, c_z]``; with ``residual``, ``z`` plus the
    update (``_plus``)."""
    weights = (ln_x_w, ln_x_b, ln_z_w, ln_z_b, w_out, w_gate)
    if _on_triton(z, x.shape[-1], z.shape[-1]):
        return _triton().triangle_update(x, z, *weights, residual)
    if residual and _adds_after(z):
        return _plus(z, _triangle_update(x, z, *weights, False))
    return _triangle_update(x, z, *weights, residual)


@kernels.compiled
def _triangle_update(x: torch.Tensor, z: torch.Tensor, ln_x_w: torch.Tensor, ln_x_b: torch.Tensor,
                     ln_z_w: torch.Tensor, ln_z_b: torch.Tensor, w_out: torch.Tensor,
                     w_gate: torch.Tensor, residual: bool) -> torch.Tensor:
    xn = layer_norm(x, (x.shape[-1],), ln_x_w, ln_x_b)
    zn = layer_norm(z, (z.shape[-1],), ln_z_w, ln_z_b)
    update = F.linear(xn, w_out) * torch.sigmoid(F.linear(zn, w_gate))
    return z.add_(update) if residual else update
