"""Emulated context parallelism: rank 0 of a cp=K group, alone on one device (``emulate=true``).

The worker joins torch's fake process group (``init_process_group("fake", store=FakeStore(),
rank=0, world_size=K)``): the same DeviceMesh (``("cp",)`` or ``("cp0", "cp1")``), the same
model, batch and step as rank 0 of a real run, and every collective returns at once without
moving or writing anything. What that measures exactly is this rank's memory (its shards, its
chunk buffers, the receive buffers the collectives would fill: all allocated as in a real run)
and its compute time; what it cannot measure (time on the link, the communicator's own device
memory) is modelled: ``emulate.comm_reserve_gib`` is held back from the device
(``memory.apply_limit``), and the collectives' counted calls and bytes
(``stats.comm_per_block``, ``stats.comm_step``) become time through a ``link`` model
(``cpbench.report.comm_model``).

Why rank 0 stands for every rank: every sharded axis is padded to a multiple of the mesh size,
so every rank holds shards of one shape and runs the same ops on them (chunk sizes are agreed
from equal budgets); rank 0 holds no padding rows (padding sits at the end of the token axis),
so its masks are the densest, and in 2d it is the rank of its grid row that owns the single
representation (``Layout.owns_single``): the largest share of the work. Receive buffers the fake
backend leaves untouched are filled with what this rank itself sent, so values stay finite and
of the same magnitude: every receive posted through ``torch.distributed.batch_isend_irecv`` (the
reference's p2p moves and Cannon ring, ``models/pairformer/parallel/p2p.py``, and any adapter's,
such as Fold-CP's rings) by ``fill_p2p_receives``, installed with the group; the collectives'
outputs by their callers (``models/pairformer/parallel/comm.py``, ``transpose.py``).
The worker's ``check_finite`` verifies the step's numbers (on every run). A user's adapter is otherwise emulated as it is:
its own collectives also return at once, and their outputs hold what it allocated or what the
fake backend copied there.

Those fills stand in for what a real run's collectives write (NCCL's kernels, link time, which the
communication model counts), and so do the copies the fake backend itself makes (torch 2.13: an
all-gather copies the input into every block, an all-to-all its send buffer whole; torch 2.11's
all-gather too), so neither is this rank's compute: every fill, every collective of the
reference, and every call of torch's collectives under the fake group (``clock_collectives``,
installed with the group: an adapter's, a DTensor's redistribute) runs inside ``FILLS.timed``
(``cpbench.models.fills``: an adapter that fills buffers of its own can clock them the same way),
and the worker takes their time out of each timed step (the record's ``emulation_fill_ms``).
Measured on one H200 (2026-12-06, N=2,048, cp=2): the reference's all-gather fills were 0.51 ms
per triangle product, and the fake backend's own copies in the same all-gathers as much again.
"""

from __future__ import annotations

import torch

from cpbench.models.fills import FILLS

__all__ = ["FILLS", "clock_collectives", "fill_p2p_receives", "init_fake_group"]

# torch's collectives that the fake backend may run a copy in (torch 2.13: all-gathers, reduce-scatters,
# all-to-alls), per module; the names a torch version lacks are skipped. ``batch_isend_irecv`` is
# ``fill_p2p_receives``'s.
COLLECTIVES = {
    "torch.distributed": ("all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
                          "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single",
                          "all_reduce", "broadcast", "reduce", "gather", "scatter"),
    "torch.distributed._functional_collectives": (
        "all_gather_tensor", "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single",
        "all_to_all_single", "all_reduce"),
}


def init_fake_group(rank: int, world_size: int) -> None:
    """Join torch's fake process group as ``rank`` of ``world_size`` (importing ``fake_pg``
    registers the backend)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    fill_p2p_receives()
    clock_collectives()


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The first tensor among the arguments, looking one level into lists (``all_gather``'s output
    list comes first)."""
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor):
                return t
    return None


def clock_collectives() -> None:
    """Run torch's collectives (``COLLECTIVES``: ``torch.distributed``'s and the functional ones that
    DTensor redistributes with) inside ``FILLS.timed`` under the fake group: whatever the fake
    backend does in them (torch 2.13 copies inputs into outputs) stands for NCCL's writes, link
    time, not the rank's compute; so an adapter's collectives are left out of its emulated step as
    the reference's are. Installed once, on the module attributes (a name bound before, such as
    ``from torch.distributed import all_gather``, keeps torch's own); outside the fake group each
    call is torch's own."""
    import importlib

    import torch.distributed as dist

    for module_name, names in COLLECTIVES.items():
        module = importlib.import_module(module_name)
        for name in names:
            collective = getattr(module, name, None)
            if collective is None or getattr(collective, "_clocked_under_fake", False):
                continue
            setattr(module, name, _clocked(collective, dist))


def _clocked(collective, dist):
    """``collective`` run inside ``FILLS.timed`` when the default group is the fake one."""
    import functools

    @functools.wraps(collective)
    def run(*args, **kwargs):
        if torch.compiler.is_compiling():  # traced: the wrapper is not part of the graph
            return collective(*args, **kwargs)
        like = _first_tensor(args, kwargs)
        if like is None or not (dist.is_initialized() and dist.get_backend() == "fake"):
            return collective(*args, **kwargs)
        with FILLS.timed(like):
            return collective(*args, **kwargs)

    run._clocked_under_fake = True
    return run


def fill_p2p_receives() -> None:
    """Make ``torch.distributed.batch_isend_irecv`` fill, under the fake group, each receive buffer
    of the batch with what a peer in the same role sends (finite, of the same magnitude): the
    send of the same position among the batch's sends when its shape and dtype match, else the
    first send of that shape and dtype, else zeros. Receives are filled before the call returns,
    as a real ``wait()`` would leave them. Installed once; outside the fake group the call is
    torch's own."""
    import torch.distributed as dist

    if getattr(dist.batch_isend_irecv, "_fills_fake_receives", False):
        return
    torch_batch_isend_irecv = dist.batch_isend_irecv

    def batch_isend_irecv(p2p_op_list):
        works = torch_batch_isend_irecv(p2p_op_list)
        if dist.is_initialized() and dist.get_backend() == "fake":
            sends = [op.tensor for op in p2p_op_list if op.op is dist.isend]
            recvs = [op.tensor for op in p2p_op_list if op.op is dist.irecv]
            with torch.no_grad():
                for i, buf in enumerate(recvs):
                    fits = [t for t in sends[i:i + 1] + sends if t.shape == buf.shape and t.dtype == buf.dtype]
                    with FILLS.timed(buf):
                        buf.copy_(fits[0]) if fits else buf.zero_()
        return works

    batch_isend_irecv._fills_fake_receives = True
    dist.batch_isend_irecv = batch_isend_irecv
