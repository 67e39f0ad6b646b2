"""The kernel switch's bookkeeping (``cpbench/models/pairformer/ops/kernels.py``): which backend's
ops a step ran, and what counts as compile time. The kernels themselves are parity-tested in
``tests/distributed/test_kernels_parity.py`` (CPU) and ``scripts/kernel_parity.py`` (GPU)."""

import inspect
import sys

import pytest
import torch

from cpbench.models.pairformer.ops import kernels


def test_the_kernels_a_step_ran():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    saved = kernels.active(), kernels._compile_training
    try:
        kernels.select("flex", cpu)
        kernels.compile_training(True)
        assert kernels.ran(training=False, device=cpu) == "flex"  # eager flex forward
        assert kernels.ran(training=True, device=cpu) == "torch"  # no flex backward on a CPU
        assert kernels.ran(training=True, device=cuda) == "flex"
        kernels.compile_training(False)
        assert kernels.ran(training=True, device=cuda) == "torch"
        kernels.select("torch", cpu)
        assert kernels.ran(training=False, device=cuda) == "torch"
    finally:
        kernels._active, kernels._compile_training = saved


def test_compile_time_counts_the_lazy_backward_compiles(monkeypatch):
    """Training's backward graphs compile at the first backward, outside the first-call window
    of ``kernels.compiled``; ``compile_seconds`` adds them from dynamo's compile-time metrics."""
    from torch._dynamo.utils import compilation_time_metrics

    monkeypatch.setattr(kernels, "_compile_s", 2.0)
    with monkeypatch.context() as no_dynamo:
        no_dynamo.delitem(sys.modules, "torch._dynamo.utils")
        assert kernels.compile_seconds() == 2.0  # nothing compiled: dynamo's metrics are not read
    monkeypatch.setitem(compilation_time_metrics, kernels.FORWARD_COMPILE_METRIC, [1.0])
    monkeypatch.setitem(compilation_time_metrics, kernels.BACKWARD_COMPILE_METRIC, [1.5, 0.25])
    assert kernels.compile_metric_seconds(kernels.BACKWARD_COMPILE_METRIC) == pytest.approx(1.75)
    assert kernels.compile_seconds() == pytest.approx(3.75)  # the first calls' 2 s: more than the metric's 1 s
    monkeypatch.setitem(compilation_time_metrics, kernels.FORWARD_COMPILE_METRIC, [1.0, 2.0])
    assert kernels.compile_seconds() == pytest.approx(4.75)  # a recompile outside the first calls


def test_compile_time_counts_a_recompile_of_a_seen_shape():
    """A guard that fails on a shape already seen (here autograd off, then an input that needs no
    gradient) recompiles inside what would be a timed step: ``compile_seconds`` counts it, and the
    metric it reads is the one dynamo records (real dynamo compiles on the CPU; the aot_eager
    backend skips inductor's C++ build, ~30 s on two cores, which the metric does not depend on)."""
    torch._dynamo.reset()

    def norm_project(x, w):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],)) @ w

    fn = torch.compile(norm_project, dynamic=False, backend="aot_eager")
    x, w = torch.randn(16, 8, requires_grad=True), torch.randn(8, 4, requires_grad=True)
    fn(x, w).sum().backward()
    first = kernels.compile_seconds()
    assert first > 0.0 and kernels.compile_metric_seconds(kernels.FORWARD_COMPILE_METRIC) > 0.0
    with torch.no_grad():
        fn(x, w)
    fn(x.detach(), w)
    assert kernels.compile_seconds() > first


def test_the_backward_compile_metric_is_the_one_inductor_records():
    from torch._inductor import compile_fx

    assert f'"{kernels.BACKWARD_COMPILE_METRIC}"' in inspect.getsource(compile_fx)
