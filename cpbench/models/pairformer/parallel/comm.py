"""Collectives of the sharded trunk: autograd-aware, and counting the bytes each rank sends.

Every collective goes through this module so that ``BYTES`` holds what this rank sent, per
collective kind (calls and bytes: ``CommCounter``; the
bandwidth-optimal ring volume: all-gather of ``x`` sends ``(P-1)·|x|``, reduce-scatter of
``y`` sends ``(P-1)/P·|y|``, all-to-all of ``y`` sends ``(P-1)/P·|y|``, all-reduce of ``y``
sends ``2(P-1)/P·|y|``). The trunk snapshots it per block for ``stats()``.

Autograd: the backward of ``all_gather_rows`` is a reduce-scatter (sum), of ``sum_over`` an
all-reduce. The pair transposes are ``transpose.py``; point-to-point moves ``p2p.py``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.distributed as dist

from cpbench.models.fills import FILLS
from cpbench.models.pairformer.parallel.layout import Layout

# Collective kinds counted apart (the communication model prices each with its own bus bandwidth).
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p")


class CommCounter:
    """Calls and bytes this rank has sent through ``comm``, per collective kind, since ``reset``.

    A p2p call is one ``batch_isend_irecv`` exchange (its sends' bytes); an agreement (``agree_min``)
    counts as an all-reduce."""

    def __init__(self) -> None:
        self.calls = dict.fromkeys(KINDS, 0)
        self.bytes = dict.fromkeys(KINDS, 0)

    def reset(self) -> None:
        self.calls, self.bytes = dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0)

    def add(self, n_bytes: float, kind: str) -> None:
        self.calls[kind] += 1
        self.bytes[kind] += int(n_bytes)

    @property
    def sent_b(self) -> int:
        """Bytes sent, every kind together."""
        return sum(self.bytes.values())

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{kind: {"calls": c, "bytes": b}}`` so far (kinds without a call left out)."""
        return {k: {"calls": self.calls[k], "bytes": self.bytes[k]} for k in KINDS if self.calls[k]}

    def since(self, earlier: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        """What was counted after the ``earlier`` snapshot, per kind."""
        now = self.snapshot()
        out = {}
        for kind, v in now.items():
            before = earlier.get(kind, {"calls": 0, "bytes": 0})
            if v["calls"] > before["calls"]:
                out[kind] = {"calls": v["calls"] - before["calls"], "bytes": v["bytes"] - before["bytes"]}
        return out


BYTES = CommCounter()
# The *_single names replace the *_tensor ones in recent torch; same semantics.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def is_fake(group: Any = None) -> bool:
    """Whether ``group`` runs on torch's fake backend (emulated CP, ``cpbench.harness.emulation``):
    every collective returns at once, and no peer's data arrives, so the callers below fill what a
    real peer would have sent: values stay finite and no data-dependent path differs."""
    return dist.is_initialized() and dist.get_backend(group) == "fake"


def link_work(group: Any, like: torch.Tensor) -> contextlib.AbstractContextManager:
    """Context for a collective and, under the fake group, its fills: what runs inside stands for
    what a real run's collective does on the device (NCCL's kernels: link time, which the
    communication model counts), so under the fake group it is clocked by ``FILLS`` and the worker
    takes it out of the step (``emulation_fill_ms``); outside it, nothing.

    The collective itself is inside because torch's fake backend is not free on every version:
    torch 2.13's copies each input into the outputs (an all-gather writes its input into every
    rank's block, a reduce-scatter this rank's block, an all-to-all its send buffer whole), and the
    GPU image's torch 2.11 at least its all-gather (one H200 block at N=2,048 cp=2 showed four
    device copies per triangle product, 1.02 ms, where the fills make two, clocked at 0.51 ms:
    2026-12-06, ``docs/perf_notes.md``)."""
    return FILLS.timed(like) if is_fake(group) else contextlib.nullcontext()


def _gloo_staging(like: torch.Tensor) -> torch.Tensor | None:
    """Emulated CP on a CPU stands for gloo, whose all-gather and reduce-scatter stage the whole
    output (all-gather) or input (reduce-scatter) in a buffer of their own (measured: 64 MiB more
    peak resident memory around a 64 MiB all-gather or reduce-scatter on 2 ranks; its all-to-all
    and all-reduce none): the fake collective allocates and touches the same transient buffer so
    that the emulated peak is gloo's. NCCL (CUDA) writes in place: nothing there."""
    if like.device.type != "cpu":
        return None
    return torch.empty_like(like).fill_(0)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def gather_into(out: torch.Tensor, x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Raw all-gather along dim 0: ``out: [P*n, ...]`` (or ``[P, n, ...]``) <- every rank's
    ``x: [n, ...]``."""
    x = x.contiguous()
    with link_work(layout.group, out):
        _all_gather(out.view(-1, *x.shape[1:]), x, group=layout.group)
        if is_fake(layout.group):  # every peer's rows: this rank's, as if all held the same
            staged = _gloo_staging(out)
            for block in out.view(layout.size, *x.shape):  # one contiguous copy each (a broadcast copy is slower)
                block.copy_(x)
            del staged
    BYTES.add((layout.size - 1) * _nbytes(x), "all_gather")
    return out


def reduce_scatter_into(out: torch.Tensor, y: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Raw reduce-scatter (sum) along dim 0: ``out: [n, ...]`` <- sum over ranks of this
    rank's block of ``y: [P*n, ...]`` (or ``[P, n, ...]``)."""
    y = y.contiguous()
    with link_work(layout.group, out):
        _reduce_scatter(out, y.view(-1, *out.shape[1:]), group=layout.group)
        if is_fake(layout.group):  # this rank's own block (the peers' contributions are not there)
            staged = _gloo_staging(y)
            out.copy_(y.view(layout.size, *out.shape)[layout.rank])
            del staged
    BYTES.add((layout.size - 1) * _nbytes(y) / layout.size, "reduce_scatter")
    return out


def all_reduce_(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """In-place sum over the CP group (no autograd)."""
    if layout.sharded:
        with link_work(layout.group, t):
            dist.all_reduce(t, group=layout.group)  # fake: t stays this rank's own (finite)
        BYTES.add(2 * (layout.size - 1) * _nbytes(t) / layout.size, "all_reduce")
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
    with link_work(layout.group, t):
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=layout.group)
    BYTES.add(2 * (layout.size - 1) * t.numel() * t.element_size() / layout.size, "all_reduce")
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
        with link_work(layout.group, x):
            dist.all_reduce(x, op=dist.ReduceOp.MAX, group=layout.group)
        BYTES.add(2 * (layout.size - 1) * _nbytes(x) / layout.size, "all_reduce")
    return x
