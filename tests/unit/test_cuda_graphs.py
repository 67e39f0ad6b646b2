"""The trunk's blocks and the sampler's denoiser as replayed graphs (``model.cuda_graphs``): the
plumbing around the capture (static inputs, the shared pair buffer, eager first calls,
fallbacks), run on the CPU with a graph that has CUDA capture's semantics (a capture runs
nothing; a replay writes the captured outputs in place). Compared with the eager trunk and
sampler on fresh random inputs. The real capture runs on a GPU: ``scripts/graph_parity.py``."""

from __future__ import annotations

import pytest
import torch

from cpbench.models.pairformer import stage_timer
from cpbench.models.pairformer.adapter import PairformerAdapter
from cpbench.models.pairformer.modules.cuda_graphs import GraphedBlocks, GraphedDenoiser
from cpbench.models.pairformer.modules.sampler import sample
from cpbench.models.pairformer.parallel import chunking

# The diffusion module at small sizes too (the plumbing is under test, not Boltz-2's 24 blocks of 768).
SIZES = dict(c_s=16, c_z=8, blocks=3, heads_single=2, heads_tri=2, head_dim_tri=4, transition_factor=2,
             dtype="fp32", c_atom=8, c_atompair=4, atom_blocks=1, atom_heads=2, c_m=8, msa_blocks=1,
             diffusion=dict(c_token=16, blocks=2, heads=2, c_atom=8, c_atompair=4, atom_blocks=1, atom_heads=2,
                            c_fourier=8))


class FakeGraph:
    """A CPU stand-in for ``cuda_graphs.CudaGraph``. ``capture(fn)`` runs ``fn`` only to learn
    its outputs and puts back every tensor ``fn`` closes over (a CUDA capture runs nothing);
    ``replay()`` runs ``fn`` again and writes its results into the captured outputs, which, as in
    a graph's pool, keep their addresses."""

    captures = 0

    def capture(self, fn):
        FakeGraph.captures += 1
        tensors = [c.cell_contents for c in fn.__closure__ or () if isinstance(c.cell_contents, torch.Tensor)]
        saved = [t.clone() for t in tensors]
        self.fn = fn
        self.out = fn()
        for t, before in zip(tensors, saved):
            t.copy_(before)
        return self.out

    def replay(self):
        out = self.fn()
        if isinstance(self.out, torch.Tensor):  # the denoiser: one output
            self.out.copy_(out)
            return
        s, z = out
        assert z.data_ptr() == self.out[1].data_ptr()  # the blocks updated the captured pair in place
        self.out[0].copy_(s)


class FailingGraph(FakeGraph):
    def capture(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")


class OnCpu:
    """Graphs on the CPU: the conditions that are CUDA's (device, ample budget) replaced by the CPU
    budget; cp > 1 and autograd still run eagerly."""

    def applies(self, like):
        return not torch.is_grad_enabled()

    def budget(self, z, layout):
        return 0 if not self.applies(z) or layout.sharded else chunking.budget_bytes(z)


class CpuGraphedBlocks(OnCpu, GraphedBlocks):
    pass


class CpuGraphedDenoiser(OnCpu, GraphedDenoiser):
    pass


def _trunk(adapter, graphs):
    torch.manual_seed(0)
    model = adapter.build_model(None, torch.device("cpu"))
    model.graphs = graphs
    return model


def _batch(adapter, seed, n=24):
    torch.manual_seed(seed)
    return adapter.build_batch(n, 3 * n, 4, None, torch.device("cpu"))


def _forward(model, batch, recycles):
    with torch.no_grad():
        s, z = model(batch, model.layout, recycles=recycles)
    return s.clone(), z.clone()


def test_replayed_blocks_match_the_eager_trunk_on_fresh_inputs():
    adapter = PairformerAdapter(**SIZES)
    eager, graphed = _trunk(adapter, None), _trunk(adapter, CpuGraphedBlocks(FakeGraph))
    FakeGraph.captures = 0
    seed = int(torch.randint(0, 2**31, (1,)))
    for step in range(3):  # new features each step: s and the mask are copied into the graph's inputs
        batch = _batch(adapter, seed + step)
        if step == 2:  # another mask of the same shape
            batch["token_mask"][-5:] = 0
        s_ref, z_ref = _forward(eager, batch, recycles=2)
        s, z = _forward(graphed, batch, recycles=2)
        torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
        torch.testing.assert_close(z, z_ref, rtol=0, atol=0)
        assert graphed.graphs.state == "replay" and graphed.block_ms == []
    assert FakeGraph.captures == 1  # first pass eager, second captured, every later one replayed


def test_first_pass_of_a_shape_is_eager_and_a_new_shape_captures_anew():
    adapter = PairformerAdapter(**SIZES)
    graphed = _trunk(adapter, CpuGraphedBlocks(FakeGraph))
    FakeGraph.captures = 0
    _forward(graphed, _batch(adapter, 1), recycles=0)
    assert graphed.graphs.state == "eager" and len(graphed.block_ms) == 3 and FakeGraph.captures == 0
    _forward(graphed, _batch(adapter, 2), recycles=0)
    assert graphed.graphs.state == "replay" and FakeGraph.captures == 1
    eager = _trunk(adapter, None)
    batch = _batch(adapter, 3, n=40)
    s, z = _forward(graphed, batch, recycles=1)  # new N: eager, then captured
    s_ref, z_ref = _forward(eager, batch, recycles=1)
    assert FakeGraph.captures == 2
    torch.testing.assert_close((s, z), (s_ref, z_ref), rtol=0, atol=0)


def test_a_failed_capture_runs_eagerly_and_says_why():
    adapter = PairformerAdapter(**SIZES)
    graphed, eager = _trunk(adapter, CpuGraphedBlocks(FailingGraph)), _trunk(adapter, None)
    batch = _batch(adapter, 4)
    s, z = _forward(graphed, batch, recycles=2)
    torch.testing.assert_close((s, z), _forward(eager, batch, recycles=2), rtol=0, atol=0)
    assert graphed.graphs.state == "capture failed: operation not permitted when stream is capturing"
    assert len(graphed.block_ms) == 3


def test_graphs_stay_off_where_they_do_not_apply():
    """On a CPU (the real class), under autograd and at cp > 1 the blocks run eagerly."""
    adapter = PairformerAdapter(**SIZES, cuda_graphs=True)
    model = _trunk(adapter, GraphedBlocks(FakeGraph))
    batch = _batch(adapter, 5)
    for _ in range(3):
        adapter.run_step(model, batch, train=False)
        assert adapter.stats()["cuda_graphs"] == "eager" and "block_mean" in adapter.stats()["stage_ms"]
    fake = CpuGraphedBlocks(FakeGraph)
    z = torch.zeros(4, 4, 2)
    sharded = type("Layout", (), {"sharded": True})()
    assert fake.budget(z, sharded) == 0
    with torch.enable_grad():
        assert fake.budget(z, type("Layout", (), {"sharded": False})()) == 0
        assert fake.pair_buffer((4, 4, 2), z, torch.float32) is not fake.pair_buffer((4, 4, 2), z, torch.float32)


def test_adapter_reports_how_the_blocks_ran():
    adapter = PairformerAdapter(**SIZES, cuda_graphs=True)
    model = adapter.build_model(None, torch.device("cpu"))
    assert isinstance(model.graphs, GraphedBlocks)
    model.graphs = CpuGraphedBlocks(FakeGraph)
    batch = _batch(adapter, 6)
    adapter.run_step(model, batch, train=False)  # recycles=0: one pass a step, the first eager
    assert adapter.stats()["cuda_graphs"] == "eager" and adapter.stats()["graph_capture_s"] == 0
    adapter.run_step(model, batch, train=False)
    stats = adapter.stats()
    assert stats["cuda_graphs"] == "replay" and stats["graph_capture_s"] > 0
    assert "block_mean" not in stats["stage_ms"]  # one graph: no per-block times
    assert "cuda_graphs" not in PairformerAdapter(**SIZES).stats()


def test_a_replay_reports_its_captures_peak_to_the_open_stages():
    timer = stage_timer.StageTimer("cpu")
    timer._open = ["trunk", "outer"]  # as on CUDA, inside two stages
    timer.note_peak(3 << 30)
    timer._open = ["trunk"]
    timer.note_peak(2 << 30)
    assert timer.peaks_gib() == {"trunk": 3.0, "outer": 3.0}


@pytest.mark.parametrize("flag, allowed", [("cuda_graphs", "true or false or auto"), ("compile_training", "true or false")])
def test_reference_trunk_flags_are_booleans(flag, allowed):
    from cpbench.config import ConfigError, resolve_point

    from helpers.run import compose_cfg

    with pytest.raises(ConfigError, match=rf"^model\.{flag}=yes: {allowed}$"):
        resolve_point(compose_cfg("device=cpu", "model=tiny", f"model.{flag}=yes"))


def test_graph_parity_script_compares_replay_with_eager(monkeypatch):
    """``scripts/graph_parity.py`` (run on a GPU before the path is timed), here with the CPU graph:
    its comparison passes where the replay is right, and fails where a replay is stale."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    graph_parity = __import__("graph_parity")

    def small_setup(n, blocks, kernels, mesh, device, dtype="bf16", workflow=None):
        """The script's trunk_setup at this file's small sizes (the comparison is under test, not Boltz-2's widths)."""
        adapter = PairformerAdapter(**{**SIZES, **(workflow or {"sampling": False, "recycles": 0}),
                                       "blocks": blocks, "dtype": dtype, "kernels": kernels})
        torch.manual_seed(0)
        model = adapter.build_model(mesh, device)
        return adapter, model, adapter.build_batch(n, 8 * n, 256, mesh, device)

    monkeypatch.setattr(graph_parity, "trunk_setup", small_setup)
    monkeypatch.setattr(graph_parity, "GraphedBlocks", lambda: CpuGraphedBlocks(FakeGraph))
    line = graph_parity.one_case(16, 1, "torch", "fp32", None, torch.device("cpu"))
    assert line["ok"] and line["state"] == "replay" and line["max_abs_new_batch"] == {"s": 0.0, "z": 0.0}

    class StaleGraph(FakeGraph):
        def replay(self):  # runs on the captured inputs, not the new batch's
            if not hasattr(self, "first"):
                self.first = True
                super().replay()

    monkeypatch.setattr(graph_parity, "GraphedBlocks", lambda: CpuGraphedBlocks(StaleGraph))
    assert not graph_parity.one_case(16, 1, "torch", "fp32", None, torch.device("cpu"))["ok"]
    monkeypatch.setattr(graph_parity, "GraphedDenoiser", lambda: CpuGraphedDenoiser(FakeGraph))
    line = graph_parity.denoiser_case(16, 1, "torch", "fp32", None, torch.device("cpu"), steps=3)
    assert line["ok"] and line["state"] == "replay" and line["max_abs"] == 0.0
    monkeypatch.setattr(graph_parity, "GraphedDenoiser", lambda: CpuGraphedDenoiser(StaleGraph))
    assert not graph_parity.denoiser_case(16, 1, "torch", "fp32", None, torch.device("cpu"), steps=3)["ok"]
    sys.modules.pop("graph_parity", None)


def _sampled(adapter, model, batch, graphs, seed, steps=5, samples=2):
    with torch.no_grad():
        s, z = model(batch, model.layout, recycles=0)
        ctx = model.diffusion.prepare(s, z, model.s_inputs, batch, model.layout)
        return sample(model.diffusion, ctx, steps, samples, seed, graphs=graphs)


def test_replayed_denoiser_matches_the_eager_sampler_on_fresh_inputs():
    adapter = PairformerAdapter(**SIZES, sampling=True, sampling_steps=5, samples=2)
    model = _trunk(adapter, None)
    graphs = CpuGraphedDenoiser(FakeGraph)
    FakeGraph.captures = 0
    for run in range(2):  # a sampling run per step: each captures its own graph (its conditioning)
        batch, seed = _batch(adapter, 10 + run, n=16), int(torch.randint(0, 2**31, (1,)))
        eager = _sampled(adapter, model, batch, None, seed)
        graphed = _sampled(adapter, model, batch, graphs, seed)
        torch.testing.assert_close(graphed, eager, rtol=0, atol=0)
        assert graphs.state == "replay" and FakeGraph.captures == run + 1


def test_a_failed_denoiser_capture_samples_eagerly_from_then_on():
    adapter = PairformerAdapter(**SIZES, sampling=True, sampling_steps=4, samples=2)
    model = _trunk(adapter, None)
    graphs = CpuGraphedDenoiser(FailingGraph)
    batch = _batch(adapter, 12, n=16)
    eager = _sampled(adapter, model, batch, None, 7)
    torch.testing.assert_close(_sampled(adapter, model, batch, graphs, 7), eager, rtol=0, atol=0)
    assert graphs.state.startswith("capture failed: operation not permitted")
    FailingGraph.capture = lambda self, fn: pytest.fail("a failed capture is not tried again")
    try:
        torch.testing.assert_close(_sampled(adapter, model, batch, graphs, 7), eager, rtol=0, atol=0)
    finally:
        del FailingGraph.capture
    assert graphs.state.startswith("capture failed")


def test_adapter_reports_the_denoiser_graph():
    adapter = PairformerAdapter(**SIZES, sampling=True, sampling_steps=3, samples=2, cuda_graphs=True)
    model = adapter.build_model(None, torch.device("cpu"))
    assert isinstance(model.denoiser_graphs, GraphedDenoiser)
    model.denoiser_graphs = CpuGraphedDenoiser(FakeGraph)
    adapter.run_step(model, _batch(adapter, 13, n=16), train=False)
    stats = adapter.stats()
    assert stats["cuda_graphs"] == "eager" and stats["cuda_graphs_denoiser"] == "replay"
    assert stats["graph_capture_s"] > 0
    assert "cuda_graphs_denoiser" not in PairformerAdapter(**SIZES, cuda_graphs=True).stats()
