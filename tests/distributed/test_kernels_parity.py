"""The ``flex`` kernel path matches the ``torch`` reference: eager FlexAttention (forward; its
backward does not run on a CPU) and the fused passes, in the whole trunk without autograd, at
cp=1, cp=2 (1d) and a 2x2 grid (2d, where the ring's pieces take flex's log-sum-exp), against
the ``torch`` path at cp=1; the Triton kernels (``model.passes=triton``, ``model.attention=triton``)
the same way in Triton's interpreter, and the Triton passes with their backward in a training
step (outputs and the whole gradient). gloo, fp32, fresh random weights and inputs, N not
divisible by cp. The GPU comparison (compiled flex, gradients, bf16) is ``scripts/kernel_parity.py``.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from cpbench.models.pairformer.adapter import PairformerAdapter, all_reduce_grads, trunk_loss
from cpbench.models.pairformer.ops import kernels
from cpbench.models.pairformer.parallel import chunking
from cpbench.models.pairformer.parallel.layout import layout_from_mesh

from helpers.dist import run_distributed
from helpers.parity import record_trunk_grad_errors, rel_error

N, N_ATOMS, S = 13, 40, 3
TOL = 1e-5
TINY = dict(c_s=16, c_z=8, blocks=2, heads_single=2, heads_tri=2, head_dim_tri=4, transition_factor=2, c_atom=8,
            c_atompair=4, atom_blocks=1, atom_heads=2, c_m=8, msa_blocks=1, dtype="fp32", recycles=1)
LEAN_BUDGET_B = 2048  # several row chunks per op, so flex sees a ragged last chunk too


TRITON_BUDGET_B = 64 * 1024
# Sizes the Triton kernels take (power-of-two channels from 16: c_z, heads x head_dim, c_s; hidden 64;
# the attention's head dim 16)
TINY_TRITON = {**TINY, "c_s": 16, "c_z": 16, "head_dim_tri": 16, "transition_factor": 4}
TRITON_KERNELS = ("norm_linear", "triangle_operands", "triangle_update", "gated_output", "swiglu_transition",
                  "attention")


def _trunk_out(backend: str, mesh, seed: int, passes: str = "inductor",
               sizes: dict = TINY) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, z) of the trunk under ``backend``; 1d/2d shards as this rank holds them. ``passes=triton``
    runs the Triton attention too (``model.attention=triton``)."""
    attention = "triton" if passes == "triton" else "auto"
    adapter = PairformerAdapter(**sizes, kernels=backend, passes=passes, attention=attention)
    torch.manual_seed(seed)
    model = adapter.build_model(mesh, torch.device("cpu"))
    torch.manual_seed(seed + 1)
    batch = adapter.build_batch(N, N_ATOMS, S, mesh, torch.device("cpu"))
    assert kernels.active() == backend
    # the Triton passes take channel chunks of 16 or more: a budget whose chunks are whole channels
    with torch.no_grad(), chunking.override_budget(LEAN_BUDGET_B if passes == "inductor" else TRITON_BUDGET_B):
        return model(batch, model.layout, recycles=1)


def _worker(rank: int, world: int, seed: int, shape: tuple[int, ...], passes: str = "inductor") -> dict:
    names = ("cp",) if len(shape) == 1 else ("cp0", "cp1")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    sizes = TINY_TRITON if passes == "triton" else TINY
    s_ref, z_ref = _trunk_out("torch", None, seed, sizes=sizes)  # cp=1: the serial layout, no collectives
    calls = _count_triton_calls() if passes == "triton" else {}
    s, z = _trunk_out("flex", mesh, seed, passes, sizes)
    layout = layout_from_mesh(mesh)
    n_pad = z.shape[1] * (layout.grid.cp1 if layout.grid is not None else 1)
    rows, cols = layout.rows(n_pad), layout.cols(n_pad)
    k_r, k_c = max(0, min(rows.stop, N) - rows.start), max(0, min(cols.stop, N) - cols.start)
    real_rows, real_cols = slice(rows.start, rows.start + k_r), slice(cols.start, cols.start + k_c)
    return {"z": rel_error(z[:k_r, :k_c], z_ref[real_rows, real_cols]),
            "s": rel_error(s[:k_r], s_ref[real_rows]), "flex_ran": kernels.active(), "triton_calls": calls}


def _count_triton_calls(training: bool = False) -> dict:
    """Wrap the Triton passes and attention (``ops/fused.py`` and ``ops/biased_attention.py`` look
    them up at each call) to count their calls; ``training``: the passes' autograd functions."""
    from cpbench.models.pairformer.ops import triton_attention, triton_backward, triton_passes

    calls: dict = {}
    for name in TRITON_KERNELS[:-1] if training else TRITON_KERNELS:
        module = triton_attention if name == "attention" else triton_backward if training else triton_passes

        def counted(*args, _fn=getattr(module, name), _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _fn(*args, **kwargs)
        setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("shape", [(1,), (2,), (2, 2)], ids=["cp1", "cp2", "2x2"])
def test_flex_trunk_forward_matches_torch_at_cp1(shape):
    seed = int.from_bytes(os.urandom(4), "little")
    results = run_distributed(_worker, int(torch.tensor(shape).prod()), (seed, shape))
    for rank, res in enumerate(results):
        assert res["flex_ran"] == "flex"
        assert res["z"] < TOL and res["s"] < TOL, (seed, shape, rank, res)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton is not installed (pip install triton): its kernels run here in its interpreter")
@pytest.mark.parametrize("shape", [(1,), (2,), (2, 2)], ids=["cp1", "cp2", "2x2"])
def test_triton_kernels_trunk_forward_matches_torch_at_cp1(shape):
    """``model.passes=triton model.attention=triton`` (every pass over z and the triangle attention
    a Triton kernel, in Triton's CPU interpreter; the 2d ring takes its log-sum-exp) in the whole
    trunk, every layout, against the ``torch`` path at cp=1; each kernel ran."""
    seed = int.from_bytes(os.urandom(4), "little")
    results = run_distributed(_worker, int(torch.tensor(shape).prod()), (seed, shape, "triton"))
    for rank, res in enumerate(results):
        assert res["z"] < TOL and res["s"] < TOL, (seed, shape, rank, res)
        assert set(res["triton_calls"]) == set(TRITON_KERNELS), res["triton_calls"]


TRAINING_BUDGET_B = 1 << 20  # whole channel chunks: the Triton operands take 16 channels or more


def _train_worker(rank: int, world: int, seed: int, shape: tuple[int, ...]) -> dict:
    """One training step's outputs and every parameter gradient: ``flex`` with the Triton passes
    under autograd (``ops/triton_backward.py``, interpreted; checkpointed blocks) on this mesh,
    against the ``torch`` path at cp=1."""
    names = ("cp",) if len(shape) == 1 else ("cp0", "cp1")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    cpu = torch.device("cpu")
    built = {}
    grads = {}
    for key, kwargs, m in (("ref", dict(kernels="torch"), None), ("triton", dict(kernels="flex", passes="triton"), mesh)):
        adapter = PairformerAdapter(**TINY_TRITON, **kwargs)
        torch.manual_seed(seed)
        model = adapter.build_model(m, cpu)
        torch.manual_seed(seed + 1)
        batch = adapter.build_batch(N, N_ATOMS, S, m, cpu)
        calls = _count_triton_calls(training=True) if key == "triton" else {}
        with chunking.override_budget(TRAINING_BUDGET_B):
            s, z = model(batch, model.layout, recycles=1, checkpointing=key == "triton")
            trunk_loss(s, z, batch["token_mask"], model.layout).backward()
        all_reduce_grads(model, model.layout)
        built[key], grads[key] = (s.detach(), z.detach(), model.layout), model
    s_ref, z_ref, _ = built["ref"]
    s, z, layout = built["triton"]
    n_pad = z.shape[1] * (layout.grid.cp1 if layout.grid is not None else 1)
    rows, cols = layout.rows(n_pad), layout.cols(n_pad)
    k_r, k_c = max(0, min(rows.stop, N) - rows.start), max(0, min(cols.stop, N) - cols.start)
    errors = {"z": rel_error(z[:k_r, :k_c], z_ref[rows.start:rows.start + k_r, cols.start:cols.start + k_c]),
              "s": rel_error(s[:k_r], s_ref[rows.start:rows.start + k_r])}
    record_trunk_grad_errors(errors, grads["triton"], grads["ref"])
    return {"errors": errors, "triton_calls": calls}


@pytest.mark.skipif(importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton is not installed (pip install triton): its kernels run here in its interpreter")
@pytest.mark.parametrize("shape", [(1,), (2,), (2, 2)], ids=["cp1", "cp2", "2x2"])
def test_triton_passes_training_matches_torch_at_cp1(shape):
    """``model.passes=triton`` in training (every pass over z a Triton kernel with its Triton
    backward, checkpointed blocks): the step's outputs and the whole gradient against the ``torch``
    path at cp=1, every layout; each of the five autograd functions ran."""
    seed = int.from_bytes(os.urandom(4), "little")
    results = run_distributed(_train_worker, int(torch.tensor(shape).prod()), (seed, shape))
    for rank, res in enumerate(results):
        assert all(err < TOL for err in res["errors"].values()), (seed, shape, rank, res["errors"])
        assert set(res["triton_calls"]) == set(TRITON_KERNELS[:-1]), res["triton_calls"]
