"""Collectives of the sharded trunk: autograd-aware, and counting the bytes each rank sends.

Every collective goes through this module so that ``BYTES`` holds what this rank sent (the
bandwidth-optimal ring volume: all-gather of ``x`` sends ``(P-1)·|x|``, reduce-scatter of
``y`` sends ``(P-1)/P·|y|``, all-to-all of ``y`` sends ``(P-1)/P·|y|``, all-reduce of ``y``
sends ``2(P-1)/P·|y|``). The trunk snapshots it per block for ``stats()``.

Autograd: the backward of ``all_gather_rows`` is a reduce-scatter (sum), of ``sum_over`` an
all-reduce. The pair transposes are ``transpose.py``; point-to-point moves ``p2p.py``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.distributed as dist

from cpbench.models.pairformer.parallel.layout import Layout


class ByteCounter:
    """Bytes this rank has sent through ``comm`` since the last ``reset``."""

    def __init__(self) -> None:
        self.sent_b = 0

    def reset(self) -> None:
        self.sent_b = 0

    def add(self, n_bytes: float) -> None:
        self.sent_b += int(n_bytes)


BYTES = ByteCounter()
# The *_single names replace the *_tensor ones in recent torch; same semantics.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def gather_into(out: torch.Tensor, x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Raw all-gather along dim 0: ``out: [P*n, ...]`` (or ``[P, n, ...]``) <- every rank's
    ``x: [n, ...]``."""
    _all_gather(out.view(-1, *x.shape[1:]), x.contiguous(), group=layout.group)
    BYTES.add((layout.size - 1) * _nbytes(x))
    return out


def reduce_scatter_into(out: torch.Tensor, y: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Raw reduce-scatter (sum) along dim 0: ``out: [n, ...]`` <- sum over ranks of this
    rank's block of ``y: [P*n, ...]`` (or ``[P, n, ...]``)."""
    _reduce_scatter(out, y.contiguous().view(-1, *out.shape[1:]), group=layout.group)
    BYTES.add((layout.size - 1) * _nbytes(y) / layout.size)
    return out


def all_reduce_(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """In-place sum over the CP group (no autograd)."""
    if layout.sharded:
        dist.all_reduce(t, group=layout.group)
        BYTES.add(2 * (layout.size - 1) * _nbytes(t) / layout.size)
    return t


_agreed = False


@contextlib.contextmanager
def agreed() -> Iterator[None]:
    """Inside the context ``agree_min`` returns its argument without a collective: the caller
    vouches that every chunk size computed inside is the same on every rank (the budgets are
    one value every rank holds, ``block.agreed_chunks``, and the shards have one shape)."""
    global _agreed
    previous, _agreed = _agreed, True
    try:
        yield
    finally:
        _agreed = previous


def agree_min(n: int | tuple[int, ...], layout: Layout, like: torch.Tensor) -> int | tuple[int, ...]:
    """The smallest ``n`` over the layout's group (one tiny all-reduce on ``like``'s device, and a
    host sync); a tuple of values is agreed element by element in the same all-reduce. Inside
    ``agreed()``, ``n`` itself.

    Chunk sizes come from each rank's free memory, which differs slightly between GPUs; a loop
    whose iterations issue collectives, or point-to-point steps that pair ranks up, must run the
    same number of times on every rank.
    """
    if not layout.sharded or _agreed:
        return n
    t = torch.tensor(n if isinstance(n, tuple) else [n], dtype=torch.int64, device=like.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=layout.group)
    BYTES.add(2 * (layout.size - 1) * t.numel() * t.element_size() / layout.size)
    return tuple(t.tolist()) if isinstance(n, tuple) else int(t.item())


class _AllGatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        ctx.layout = layout
        out = x.new_empty((layout.size * x.shape[0], *x.shape[1:]))
        return gather_into(out, x, layout)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        layout = ctx.layout
        out = grad.new_empty((grad.shape[0] // layout.size, *grad.shape[1:]))
        return reduce_scatter_into(out, grad, layout), None


def all_gather_rows(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Every rank's rows, in rank order.

    Args:
        x: ``[n, ...]`` this rank's rows.
    Returns:
        ``[P*n, ...]``. Sends ``(P-1)·|x|`` bytes; backward reduce-scatters the gradient.
    """
    if not layout.sharded:
        return x
    return _AllGatherRows.apply(x, layout)


class _SumOver(torch.autograd.Function):
    """All-reduce (sum) over a layout's group whose every rank uses the sum, so the backward is
    the all-reduce of the gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        ctx.layout = layout
        return all_reduce_(x.clone(), layout)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return all_reduce_(grad.clone(), ctx.layout), None


def sum_over(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The sum of ``x`` over the layout's group, on every rank; autograd-aware (out of place)."""
    if not layout.sharded:
        return x
    return _SumOver.apply(x, layout)


def max_over_(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """In-place element-wise max over the layout's group (no autograd)."""
    if layout.sharded:
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=layout.group)
        BYTES.add(2 * (layout.size - 1) * _nbytes(x) / layout.size)
    return x
