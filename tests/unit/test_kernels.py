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
    monkeypatch.setitem(compilation_time_metrics, kernels.BACKWARD_COMPILE_METRIC, [1.5, 0.25])
    assert kernels.backward_compile_seconds() == pytest.approx(1.75)
    assert kernels.compile_seconds() == pytest.approx(3.75)


def test_the_backward_compile_metric_is_the_one_inductor_records():
    from torch._inductor import compile_fx

    assert f'"{kernels.BACKWARD_COMPILE_METRIC}"' in inspect.getsource(compile_fx)
