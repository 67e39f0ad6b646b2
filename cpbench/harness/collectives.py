"""Counting the collectives of a step the adapter does not count itself (Fold-CP, your own model).

The reference trunk counts what each rank sends through its own collectives (``stats.comm_step``,
``models/pairformer/parallel/comm.py``), which the link model turns into time
(``cpbench.link``). Another adapter's step is counted here, below autograd, by a
``TorchDispatchMode`` that sees every collective op of torch.distributed: the eager ones
(``c10d.allreduce_``, ``c10d._allgather_base_``, ``c10d.send``, ...) and the functional ones that
DTensor issues (``_c10d_functional.all_gather_into_tensor``, ...), on NCCL, gloo or the fake
backend of emulated CP alike. Bytes follow ``comm.py``'s bandwidth-optimal ring volumes: an
all-gather of ``x`` sends ``(P-1)·|x|``, a reduce-scatter or all-to-all of ``y`` ``(P-1)/P·|y|``,
an all-reduce of ``y`` ``2(P-1)/P·|y|``, a send its tensor; a call is one op (the reference counts
one ``batch_isend_irecv`` exchange as one p2p call, this counts each send). Other collectives
(broadcast, scatter, gather, barrier) are kept apart under their own names: the link model does
not price them.

A dispatch mode runs Python for every op, so the worker counts one extra step after the timed
ones (``cpbench.harness.worker``), never a timed step.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# op name (without overload) -> (kind, bytes sent given (tensor bytes, group size))
_RING: dict[str, tuple[str, Callable[[int, int], float]]] = {}
for _names, _kind, _sent in (
    (("c10d.allreduce_", "c10d.allreduce_coalesced_", "_c10d_functional.all_reduce", "_c10d_functional.all_reduce_",
      "_c10d_functional.all_reduce_coalesced", "_c10d_functional.all_reduce_coalesced_"),
     "all_reduce", lambda b, p: 2 * (p - 1) / p * b),
    (("c10d._allgather_base_", "c10d.allgather_", "c10d.allgather_into_tensor_coalesced_",
      "c10d.allgather_coalesced_", "_c10d_functional.all_gather_into_tensor",
      "_c10d_functional.all_gather_into_tensor_out", "_c10d_functional.all_gather_into_tensor_coalesced"),
     "all_gather", lambda b, p: (p - 1) * b),
    (("c10d._reduce_scatter_base_", "c10d.reduce_scatter_", "c10d.reduce_scatter_tensor_coalesced_",
      "_c10d_functional.reduce_scatter_tensor", "_c10d_functional.reduce_scatter_tensor_coalesced"),
     "reduce_scatter", lambda b, p: (p - 1) / p * b),
    (("c10d.alltoall_base_", "c10d.alltoall_", "_c10d_functional.all_to_all_single"),
     "all_to_all", lambda b, p: (p - 1) / p * b),
    (("c10d.send",), "p2p", lambda b, p: b),
):
    for _name in _names:
        _RING[_name] = (_kind, _sent)
# counted apart, not priced: receives are the peers' sends; the rest has no kind in the link model
_UNPRICED = {"c10d.broadcast_": "broadcast", "c10d.scatter_": "scatter", "c10d.gather_": "gather",
             "c10d.reduce_": "reduce", "c10d.barrier": "barrier", "_c10d_functional.broadcast": "broadcast",
             "_c10d_functional.broadcast_": "broadcast"}


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _group_size(args: tuple, kwargs: dict) -> int:
    """The op's group size: a ``ProcessGroup`` argument (eager ops), a ``group_size`` (functional
    gather and scatter), else the group named by ``group_name``."""
    from torch._C._distributed_c10d import ProcessGroup

    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.ScriptObject):  # eager ops get the group boxed (so is their ReduceOp)
            try:
                return ProcessGroup.unbox(a).size()
            except RuntimeError:
                continue
    ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
    names = [a for a in (*args, *kwargs.values()) if isinstance(a, str)]
    if names:
        from torch.distributed.distributed_c10d import _resolve_process_group

        try:
            return _resolve_process_group(names[-1]).size()
        except Exception:  # noqa: BLE001 -- fall back to an explicit size
            pass
    return ints[0] if ints else 1


def _input_bytes(name: str, args: tuple) -> int:
    """Bytes of the op's input: for ops with (output, input) the input; else every tensor given."""
    if name in ("c10d._allgather_base_", "c10d._reduce_scatter_base_", "c10d.alltoall_base_",
                "_c10d_functional.all_gather_into_tensor_out"):
        return _nbytes(_tensors(args[1] if name != "_c10d_functional.all_gather_into_tensor_out" else args[0]))
    if name in ("c10d.allgather_", "c10d.reduce_scatter_", "c10d.alltoall_", "c10d.allgather_coalesced_",
                "c10d.allgather_into_tensor_coalesced_", "c10d.reduce_scatter_tensor_coalesced_"):
        return _nbytes(_tensors(args[1]))
    return _nbytes(_tensors(args[0]))


COUNTED_BY = "harness: one untimed step after the timed ones"


def count_step(step: Callable[[], object], sync: Callable[[], None]) -> dict:
    """Run ``step`` once under a ``CollectiveCounter``: the stats it adds (``comm_step``,
    ``comm_counted_by``, and ``comm_step_unpriced`` where other collectives ran)."""
    counter = CollectiveCounter()
    with counter:
        step()
        sync()
    out = {"comm_step": counter.counts, "comm_counted_by": COUNTED_BY}
    if counter.unpriced:
        out["comm_step_unpriced"] = counter.unpriced
    return out


class CollectiveCounter(TorchDispatchMode):
    """``with CollectiveCounter() as c: step()``; then ``c.counts`` (``{kind: {"calls", "bytes"}}``,
    the link model's kinds) and ``c.unpriced`` (other collectives, the same form)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, dict[str, int]] = {}
        self.unpriced: dict[str, dict[str, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
        name = name.replace("torch.ops.", "")
        if name in _RING:
            kind, sent = _RING[name]
            self._add(self.counts, kind, sent(_input_bytes(name, args), max(_group_size(args, kwargs), 1)))
        elif name in _UNPRICED:
            self._add(self.unpriced, _UNPRICED[name], _input_bytes(name, args))
        return func(*args, **kwargs)

    @staticmethod
    def _add(table: dict, kind: str, n_bytes: float) -> None:
        entry = table.setdefault(kind, {"calls": 0, "bytes": 0})
        entry["calls"] += 1
        entry["bytes"] += int(n_bytes)
