"""Point-to-point moves between ranks (``batch_isend_irecv``), every byte sent counted in
``comm.BYTES``: the primitives of the 2d grid transpose and the Cannon ring."""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpbench.models.pairformer.parallel.comm import BYTES

TAG_SKEW, TAG_RO, TAG_ACC = 1, 2, 3


def exchange(sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]], tag: int) -> list:
    """Post ``sends`` (peer, tensor) and ``recvs`` (peer, buffer); returns the requests."""
    ops = [dist.P2POp(dist.isend, t, peer, tag=tag) for peer, t in sends]
    ops += [dist.P2POp(dist.irecv, t, peer, tag=tag) for peer, t in recvs]
    if sends:
        BYTES.add(sum(t.numel() * t.element_size() for _, t in sends), "p2p")
    # emulated CP: the fake group's batch_isend_irecv fills the receives (harness.emulation)
    return dist.batch_isend_irecv(ops) if ops else []


def wait_all(reqs: list) -> None:
    for r in reqs:
        r.wait()


def permute(t: torch.Tensor, send_to: int, recv_from: int, tag: int = TAG_SKEW) -> torch.Tensor:
    """Send ``t`` to global rank ``send_to`` and return the same-shaped tensor from ``recv_from``
    (``t`` itself when both are this rank); blocking."""
    if send_to == recv_from == dist.get_rank():
        return t
    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    wait_all(exchange([(send_to, t.contiguous())], [(recv_from, out)], tag))
    return out
