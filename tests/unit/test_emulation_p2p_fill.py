"""Under the fake process group (``emulate=true``), receives posted through
``torch.distributed.batch_isend_irecv`` (the reference's p2p moves, Fold-CP's rings) come back
filled: with the send of the same position, else a same-shaped send of the batch, else zeros,
never the allocator's leftovers."""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from cpbench.harness import emulation


def test_fake_group_receives_are_filled_by_a_same_shaped_send_else_zeros():
    emulation.init_fake_group(0, 4)
    try:
        send = torch.randn(3, 5)
        same_shape = torch.full((3, 5), float("nan"))
        other_shape = torch.full((2, 2), float("nan"))
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, 1), dist.P2POp(dist.irecv, same_shape, 3),
                                        dist.P2POp(dist.irecv, other_shape, 3)])
        for work in works:
            work.wait()
        assert torch.equal(same_shape, send) and torch.equal(other_shape, torch.zeros(2, 2))
        # the reference's exchanges pair the i-th receive with the i-th send (both of one shape)
        first, second = torch.randn(4), torch.randn(4)
        got = [torch.full((4,), float("nan")) for _ in range(2)]
        dist.batch_isend_irecv([dist.P2POp(dist.isend, first, 1), dist.P2POp(dist.isend, second, 2),
                                dist.P2POp(dist.irecv, got[0], 3), dist.P2POp(dist.irecv, got[1], 2)])
        assert torch.equal(got[0], first) and torch.equal(got[1], second)
        installed = dist.batch_isend_irecv
        emulation.fill_p2p_receives()  # installed once: a second call does not wrap it again
        assert dist.batch_isend_irecv is installed
    finally:
        dist.destroy_process_group()


def test_the_fills_are_clocked_until_taken():
    """``FILLS``: what ran inside ``timed`` counts until ``take_ms``, which starts again; the p2p
    fill and the reference's all-gather fill run inside it."""
    from cpbench.models.pairformer.parallel import comm
    from cpbench.models.pairformer.parallel.layout import layout_1d

    emulation.FILLS.take_ms()
    with emulation.FILLS.timed(torch.zeros(1)):
        time.sleep(0.02)
    assert emulation.FILLS.take_ms() >= 20.0
    assert emulation.FILLS.take_ms() == 0.0
    emulation.init_fake_group(0, 2)
    try:
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.randn(256, 256), 1),
                                        dist.P2POp(dist.irecv, torch.empty(256, 256), 1)])
        for work in works:
            work.wait()
        assert emulation.FILLS.take_ms() > 0
        x = torch.randn(64, 8)
        out = comm.gather_into(torch.empty(128, 8), x, layout_1d())
        assert torch.equal(out[:64], x) and torch.equal(out[64:], x)
        assert emulation.FILLS.take_ms() > 0
    finally:
        dist.destroy_process_group()


def test_every_collective_of_the_reference_runs_inside_the_fill_clock(monkeypatch):
    """Under the fake group each collective the reference issues (all-gather, reduce-scatter,
    all-reduce, the 1d transposes' all-to-alls: whole-shard from row-major input and from its
    view, and in channel chunks, with and without autograd) runs inside ``FILLS.timed``: torch's
    fake backend copies inputs into outputs (what NCCL would write, link time), so that copy must
    not count as the rank's compute."""
    from cpbench.models.pairformer.parallel import chunking, comm
    from cpbench.models.pairformer.parallel.layout import layout_1d
    from cpbench.models.pairformer.parallel.transpose import transpose_pair

    depth, calls = [0], []
    timed = emulation.FILLS.timed

    @contextlib.contextmanager
    def counting_timed(like):
        depth[0] += 1
        try:
            with timed(like):
                yield
        finally:
            depth[0] -= 1

    def spy(name, collective):
        def run(*args, **kwargs):
            calls.append((name, depth[0] > 0))
            return collective(*args, **kwargs)
        return run

    monkeypatch.setattr(emulation.FILLS, "timed", counting_timed)
    monkeypatch.setattr(comm, "_all_gather", spy("all_gather", comm._all_gather))
    monkeypatch.setattr(comm, "_reduce_scatter", spy("reduce_scatter", comm._reduce_scatter))
    monkeypatch.setattr(dist, "all_reduce", spy("all_reduce", dist.all_reduce))
    monkeypatch.setattr(dist, "all_to_all_single", spy("all_to_all", dist.all_to_all_single))
    emulation.init_fake_group(0, 2)
    try:
        layout = layout_1d()
        x = torch.randn(4, 3)
        comm.gather_into(torch.empty(8, 3), x, layout)
        comm.reduce_scatter_into(torch.empty(4, 3), torch.randn(8, 3), layout)
        comm.all_reduce_(torch.randn(3), layout)
        comm.max_over_(torch.randn(3), layout)
        z = torch.randn(4, 8, 16)
        with torch.no_grad():
            with chunking.override_budget(1 << 30):  # whole shard: row-major, then from its view
                transpose_pair(transpose_pair(z.clone(), layout), layout)
            with chunking.override_budget(z.numel() * z.element_size() // 4):  # channel chunks
                transpose_pair(z.clone(), layout)
        transpose_pair(z.clone().requires_grad_(), layout).sum().backward()
        kinds = {name for name, _ in calls}
        assert kinds == {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"}, calls
        assert sum(name == "all_to_all" for name, _ in calls) >= 5, calls
        outside = [name for name, inside in calls if not inside]
        assert not outside, f"collectives outside the fill clock under the fake group: {outside}"
        assert emulation.FILLS.take_ms() > 0
    finally:
        dist.destroy_process_group()


def test_a_section_inside_another_is_counted_once(monkeypatch):
    """Nested ``FILLS.timed`` sections (the harness clocks a torch collective that the reference's
    ``comm.link_work`` already clocks) count once: the outer section's time."""
    from cpbench.models import fills

    ticks = iter(range(100))
    monkeypatch.setattr(fills.time, "perf_counter", lambda: float(next(ticks)))  # 1 s per reading
    clock = fills.FillClock()
    with clock.timed(torch.zeros(1)):  # readings 0 and 1 (counted twice: 1 and 2 inside, 0 and 3 here)
        with clock.timed(torch.zeros(1)):
            pass
    assert clock.take_ms() == 1000.0
    with clock.timed(torch.zeros(1)):  # readings 2 and 3: a clock that is left is usable again
        pass
    assert clock.take_ms() == 1000.0


def test_an_adapters_collectives_are_clocked_under_the_fake_group():
    """What an adapter calls (``torch.distributed``'s collectives, the functional ones and a DTensor
    redistribute, as Fold-CP does) runs inside the fill clock under the fake group: the fake
    backend's copies are not the rank's compute; with no fake group nothing is clocked."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    emulation.init_fake_group(0, 2)
    try:
        x = torch.randn(512, 64)
        emulation.FILLS.take_ms()
        dist.all_gather([torch.empty_like(x), torch.empty_like(x)], x)
        assert emulation.FILLS.take_ms() > 0
        dist.all_to_all_single(torch.empty_like(x), x)
        assert emulation.FILLS.take_ms() > 0
        gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
        funcol.wait_tensor(gather(x, 0, dist.group.WORLD))
        assert emulation.FILLS.take_ms() > 0
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
        full = DTensor.from_local(x, mesh, [Shard(0)]).redistribute(mesh, [Replicate()]).to_local()
        assert full.shape == (1024, 64)
        assert emulation.FILLS.take_ms() > 0
        installed = dist.all_gather
        emulation.clock_collectives()  # installed once
        assert dist.all_gather is installed
    finally:
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        emulation.FILLS.take_ms()
        x = torch.randn(8)
        dist.all_reduce(x)
        dist.all_gather([torch.empty_like(x)], x)
        assert emulation.FILLS.take_ms() == 0.0
    finally:
        dist.destroy_process_group()
