"""The kernel switch (``model.kernels``): which implementation the trunk's hot ops run.

* ``torch``: the reference path, plain PyTorch ops (SDPA with an expanded bias for triangle
  attention). The CPU and parity reference.
* ``flex``: triangle attention on ``torch.nn.attention.flex_attention`` with the shared
  ``[heads, N, N]`` bias read in ``score_mod`` (no ``[rows, heads, N, N]`` expansion), and the
  memory-bound passes (LayerNorm, projections, gating, SwiGLU) as ``torch.compile`` regions.
  On CUDA both are compiled (Triton, via inductor); on a CPU flex runs eagerly (unfused, forward
  only: its backward does not run on the CPU), which is what the parity tests use.
* ``cueq``: NVIDIA cuEquivariance's triangle attention (``cuequivariance_torch``) where it
  imports; asking for it where it does not is a one-line error.
* ``auto``: ``flex`` on CUDA, ``torch`` on a CPU.

The selection is process-wide (one worker process runs one point): the adapter calls
``select(name, device)`` once in ``build_model``; ops ask ``active()``. Compilation happens at
the first call of each compiled function per input shape in the process (``dynamic=False``:
on one H200 a dynamic-shape flex kernel ran at 22 TFLOP/s against 188 for the static one,
``docs/perf_notes.md``; a process sees one N and a few row-chunk sizes, and inductor's on-disk
cache serves the next process); ``compile_seconds()`` is the wall time those first calls took
plus inductor's backward compiles, which the adapter reports as its own stat so it stays apart
from the timed steps.

Training (autograd on) under ``flex`` on CUDA runs the compiled path too (flex attention's fused
backward, gradients into q, k, v and the bias; the compiled passes) unless
``compile_training(False)`` (``model.compile_training=false``: the eager passes and the ``torch``
attention under autograd). The first GPU attempt (dynamic shapes) failed, with a checkpoint
metadata mismatch in the recompute of a checkpointed region and, in one block without
checkpointing, parameter gradients far from the ``torch`` path's (``docs/perf_notes.md``); the
static-shape path passes ``scripts/kernel_parity.py`` on one H200 (fp32 worst parameter gradient
2.7e-6, bf16 1.1e-2). On one H200 a 2-block training step at N=2,048 took 1.32 s compiled
against 4.02 s eager (``scripts/profile_ops.py train``; the eager step spends 58 % of its kernel
time in the memory-efficient SDPA kernels, forward and backward, which the expanded bias's
gradient forces), so it is the default since commit a9aacd9 (2026-12-02). Each new N compiles anew
(a probe point is one step in a fresh process: 51.4 s of compilation in the headline sweep's
lean training point at N=2,048; 23.5 s for a 2-block step there), and the
training chunk budgets take a handful of values (``chunking.training_budget_bytes``) so a step
compiles a handful of chunk shapes. With ``model.passes=triton`` compiled training runs the
Triton passes with their Triton backward (``ops/triton_backward.py``) instead of the compiled
regions. On a CPU flex has no backward, so CPU training always runs
the ``torch`` path.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import time
from typing import Callable

import torch

KERNELS = ("auto", "torch", "flex", "cueq")
# ``model.passes``: what runs the memory-bound passes over z under ``flex`` on CUDA: inductor's
# compiled regions (``ops/fused.py``) or Triton kernels that read z once per op
# (``ops/triton_passes.py``; in compiled training with their Triton backward, ``ops/triton_backward.py``).
PASSES = ("inductor", "triton")
# ``model.attention``: what runs triangle attention without autograd: the backend's kernel (``auto``:
# FlexAttention under ``flex``) or, under ``flex`` on CUDA, a Triton kernel that shares each bias tile
# between two rows (``ops/triton_attention.py``). Training keeps FlexAttention either way.
ATTENTION = ("auto", "triton")
# Row-chunk sizes and ops differ per call site: one static compile per shape, more than dynamo's default 8.
RECOMPILE_LIMIT = 64
_active = "torch"
_compile_s = 0.0
_compile_training = True
_passes = "inductor"
_attention = "auto"


class KernelError(ValueError):
    """``model.kernels`` names a backend this machine cannot run."""


def resolve(name: str, device: torch.device) -> str:
    """The backend ``name`` means on ``device`` (``auto`` -> ``flex`` on CUDA, else ``torch``)."""
    if name not in KERNELS:
        raise KernelError(f"model.kernels={name}: one of {', '.join(KERNELS)}")
    if name == "auto":
        return "flex" if device.type == "cuda" else "torch"
    if name == "cueq" and importlib.util.find_spec("cuequivariance_torch") is None:
        raise KernelError("model.kernels=cueq: cuequivariance_torch is not installed here "
                          "(pip install cuequivariance-torch cuequivariance-ops-torch-cu12 or -cu13); "
                          "use model.kernels=flex or torch")
    return name


def select(name: str, device: torch.device) -> str:
    """Make ``name`` (resolved for ``device``) the backend of this process; returns it."""
    global _active
    _active = resolve(name, device)
    return _active


def active() -> str:
    """The backend of this process (``torch`` until ``select`` is called)."""
    return _active


def ran(training: bool, device: torch.device) -> str:
    """The backend whose ops a step ran: ``active()``, except that a training step under ``flex``
    runs the ``torch`` ops unless compiled training is on and the device is CUDA."""
    if _active == "flex" and training and not (_compile_training and device.type == "cuda"):
        return "torch"
    return _active


def compile_seconds() -> float:
    """Wall seconds of compilation in this process: the forward compiles (dynamo's frame compiles,
    ``FORWARD_COMPILE_METRIC``, every recompile included; at least the first calls' wall time,
    should the metric be missing) plus inductor's backward compiles, which AOTAutograd runs lazily
    at the first backward through each graph (``BACKWARD_COMPILE_METRIC``). A recompile of a
    shape already seen (a guard that failed: grad mode, an input's ``requires_grad``) happens
    outside the first-call window, inside a timed step; the metric counts it."""
    return max(_compile_s, compile_metric_seconds(FORWARD_COMPILE_METRIC)) + compile_metric_seconds(BACKWARD_COMPILE_METRIC)


# dynamo_timed's names: a frame's whole compile (tracing, AOTAutograd, inductor's forward graph;
# torch._dynamo.convert_frame), and inductor's backward compiler (torch._inductor.compile_fx)
FORWARD_COMPILE_METRIC = "_compile.compile_inner"
BACKWARD_COMPILE_METRIC = "compile_fx.<locals>.bw_compiler"


def compile_metric_seconds(name: str) -> float:
    """Seconds dynamo's compile-time metric ``name`` recorded in this process so far (0 while dynamo
    is not imported: nothing compiled, and importing it here would cost ~0.9 s)."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    if dynamo_utils is None:
        return 0.0
    return float(sum(dynamo_utils.compilation_time_metrics.get(name, ())))


def compile_training(on: bool) -> None:
    """Whether ``flex`` compiles under autograd too (``model.compile_training``, on by default; see
    the module docstring)."""
    global _compile_training
    _compile_training = bool(on)


def select_passes(name: str) -> None:
    """Make ``name`` (one of ``PASSES``) this process's choice for the passes over z."""
    global _passes
    if name not in PASSES:
        raise KernelError(f"model.passes={name}: one of {', '.join(PASSES)}")
    _passes = name


def triton_passes(like: torch.Tensor) -> bool:
    """Whether the Triton passes run for ``like``: ``model.passes=triton`` under ``flex``, on CUDA
    (or Triton's interpreter), without autograd or in compiled training (``compile_training``)."""
    if _passes != "triton" or _active != "flex" or (torch.is_grad_enabled() and not _compile_training):
        return False
    return _triton_runs_on(like)


def _triton_runs_on(like: torch.Tensor) -> bool:
    """Whether Triton kernels can take ``like``: on CUDA, or anywhere in Triton's interpreter."""
    from cpbench.models.pairformer.ops import triton_passes as tp  # imports Triton only when chosen

    return like.is_cuda or tp.interpreted()


def select_attention(name: str) -> None:
    """Make ``name`` (one of ``ATTENTION``) this process's choice for triangle attention."""
    global _attention
    if name not in ATTENTION:
        raise KernelError(f"model.attention={name}: one of {', '.join(ATTENTION)}")
    _attention = name


def triton_attention(like: torch.Tensor) -> bool:
    """Whether triangle attention runs the Triton kernel for ``like``: ``model.attention=triton``
    under ``flex``, on CUDA (or Triton's interpreter), without autograd."""
    if _attention != "triton" or _active != "flex" or torch.is_grad_enabled():
        return False
    return _triton_runs_on(like)


def attention_ran(training: bool, device: torch.device) -> str | None:
    """``triton`` where a step's triangle attention ran the Triton kernel (``triton_attention``), else None."""
    return "triton" if _attention == "triton" and _active == "flex" and not training and device.type == "cuda" else None


def choices_of(label: str) -> dict[str, str]:
    """The choices a backend label names, as the report writes them (``report/rows.kernels_of``)
    and the GPU scripts take them: ``flex+triton+tattn`` -> ``{"kernels": "flex", "passes":
    "triton", "attention": "triton"}`` (``+triton``: ``model.passes=triton``; ``+tattn``:
    ``model.attention=triton``)."""
    backend, *parts = label.split("+")
    unknown = set(parts) - {"triton", "tattn"}
    if unknown:
        raise KernelError(f"{label}: a backend then +triton (the passes) and/or +tattn (the attention); not {unknown}")
    return {"kernels": backend, "passes": "triton" if "triton" in parts else "inductor",
            "attention": "triton" if "tattn" in parts else "auto"}


def select_label(label: str, device: torch.device) -> dict[str, str]:
    """Select what ``label`` names (``choices_of``) for this process; returns the choices."""
    choices = choices_of(label)
    select(choices["kernels"], device)
    select_passes(choices["passes"])
    select_attention(choices["attention"])
    return choices


def passes_ran(training: bool, device: torch.device) -> str | None:
    """``triton`` where a step's passes over z ran as the Triton kernels (``triton_passes``; in
    training, the compiled training path), else None."""
    ran_triton = _passes == "triton" and _active == "flex" and device.type == "cuda" and (_compile_training or not training)
    return "triton" if ran_triton else None


def compiling(like: torch.Tensor | None) -> bool:
    """Whether compiled kernels run for ``like``: ``flex`` on CUDA, without autograd unless
    ``compile_training(True)``."""
    return (_active == "flex" and like is not None and like.is_cuda
            and (_compile_training or not torch.is_grad_enabled()))


def compiled(fn: Callable) -> Callable:
    """``fn`` under ``torch.compile`` when the ``flex`` backend runs on CUDA, else ``fn`` itself.

    The compiled function is built lazily (at its first CUDA call under ``flex``), and the time
    of each first call per input signature (dtypes and shapes) counts as compile time (the
    backward graphs' compiles and any recompiles count through ``compile_seconds``' metrics); the
    signature includes the other arguments (``None`` or a buffer, a ``residual`` flag).
    """
    state: dict = {"fn": None, "seen": set()}

    @functools.wraps(fn)
    def run(*args, **kwargs):
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if not compiling(first):
            return fn(*args, **kwargs)
        if state["fn"] is None:
            # set here, not at import: torch._dynamo costs every process ~0.9 s and 69 MiB, and
            # only flex on CUDA compiles (a worker starts for every probe point)
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            state["fn"] = torch.compile(fn, dynamic=False)
        key = tuple((a.dtype, tuple(a.shape)) if isinstance(a, torch.Tensor) else a
                    for a in (*args, *(kwargs[k] for k in sorted(kwargs))))
        if key in state["seen"]:
            return state["fn"](*args, **kwargs)
        global _compile_s
        torch.cuda.synchronize(first.device)
        start = time.perf_counter()
        out = state["fn"](*args, **kwargs)
        torch.cuda.synchronize(first.device)
        _compile_s += time.perf_counter() - start
        state["seen"].add(key)
        return out

    return run
