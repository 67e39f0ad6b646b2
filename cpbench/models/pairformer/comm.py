"""Collectives of the sharded trunk: autograd-aware, and counting the bytes each rank sends.

Every collective goes through this module so that ``BYTES`` holds what this rank sent (the
bandwidth-optimal ring volume: all-gather of ``x`` sends ``(P-1)·|x|``, reduce-scatter of
``y`` sends ``(P-1)/P·|y|``, all-to-all of ``y`` sends ``(P-1)/P·|y|``, all-reduce of ``y``
sends ``2(P-1)/P·|y|``). The trunk snapshots it per block for ``stats()``.

Autograd: the backward of ``all_gather_rows`` is a reduce-scatter (sum) and the backward of
``transpose_pair`` is ``transpose_pair`` (a transpose is its own inverse).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpbench.models.pairformer import chunking
from cpbench.models.pairformer.layout import Layout


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


def agree_min(n: int, layout: Layout, device: torch.device) -> int:
    """The smallest ``n`` over the CP group.

    Chunk sizes come from each rank's free memory, which differs slightly between GPUs; a loop
    whose iterations issue collectives must run the same number of times on every rank.
    """
    if not layout.sharded:
        return n
    t = torch.tensor([n], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=layout.group)
    BYTES.add(2 * (layout.size - 1) * t.element_size() / layout.size)
    return int(t.item())


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


def _transpose_1d(z: torch.Tensor, layout: Layout) -> torch.Tensor:
    """All-to-all that turns the row shard of Z into the row shard of Z^T (out of place).

    Channel-chunked so the send/receive buffers stay within the chunk budget.
    """
    p, n_local, c = layout.size, z.shape[0], z.shape[2]
    out = torch.empty_like(z, memory_format=torch.contiguous_format)
    # out[j, s-block i, :] = Z[i in s, j mine]: block s of the result comes from rank s.
    out_blocks = out.view(n_local, p, n_local, c)
    chunk_c = agree_min(chunking.divisor_chunk(c, 2 * _nbytes(z) // c, chunking.budget_bytes(z)), layout, z.device)
    for cs in chunking.slices(c, chunk_c):
        # send[s] = my rows, the columns of rank s: [P, n_local(i), n_local(j), chunk]
        send = z[..., cs].reshape(n_local, p, n_local, cs.stop - cs.start).permute(1, 0, 2, 3).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=layout.group)
        BYTES.add((p - 1) * _nbytes(send) / p)
        del send
        out_blocks[..., cs].copy_(recv.permute(2, 0, 1, 3))
        del recv
    return out


class _TransposePair(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: torch.Tensor, layout: Layout) -> torch.Tensor:
        ctx.layout = layout
        return _transpose_1d(z, layout)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _transpose_1d(grad.contiguous(), ctx.layout), None


def transpose_pair(z: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The local row shard of the transposed pair tensor ``Z^T`` (``Z^T[j, i] = Z[i, j]``).

    Args:
        z: ``[N/P, N, c]`` rows of Z held by this rank.
    Returns:
        ``[N/P, N, c]`` rows of Z^T. Serial: a view (no copy). 1d: one all-to-all sending
        ``(P-1)/P·|z|`` bytes; without autograd the result is written back into ``z``'s storage
        (the caller's reference stays the only pair buffer); with autograd a new tensor whose
        backward is the reverse all-to-all.
    """
    if not layout.sharded:
        return z.transpose(0, 1)
    if layout.kind == "2d":  # tile [N/cp0, N/cp1, c]: point-to-point grid transpose (grid.py)
        from cpbench.models.pairformer.grid import transpose_tiles, transpose_tiles_  # grid.py imports us

        if torch.is_grad_enabled():
            return transpose_tiles(z, layout.grid, dim=0)
        return transpose_tiles_(z, layout.grid, layout.group)  # in place, in channel chunks
    if torch.is_grad_enabled():
        return _TransposePair.apply(z, layout)
    return z.copy_(_transpose_1d(z, layout))
