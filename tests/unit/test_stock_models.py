"""The stock adapters (``model=stock/*``) in this process at tiny sizes on the CPU, and their
config checks: cp=1 only, a missing package is one line naming the install command.

Tests that build a stock trunk need its package (``bash scripts/install_stock.sh all``, as CI
does); without it they are skipped, naming that command.
"""

from __future__ import annotations

import importlib
import math
import sys

import pytest
import torch
from omegaconf import OmegaConf

from cpbench.config import ConfigError, check_group_choices, resolve_point
from cpbench.models.api import load_adapter
from cpbench.models.stock import STOCK_PACKAGES, stock_model_of
from cpbench.models.stock.packages import StockPackageError, import_trunk_module
from cpbench.models.stock.protenix import inference_chunk_size

from helpers.run import compose_cfg, run_cpbench

MODELS = tuple(STOCK_PACKAGES)
# Tiny sizes every stock config takes (their other sizes stay at the published ones).
TINY = {"c_s": 32, "c_z": 16, "blocks": 3, "heads_single": 4}


def installed(model: str) -> bool:
    try:
        import_trunk_module(model)
    except StockPackageError:
        return False
    return True


def needs(model: str):
    return pytest.mark.skipif(not installed(model), reason=f"needs {STOCK_PACKAGES[model].install_command}")


def tiny_adapter(model: str, **kwargs):
    """The adapter of ``model=stock/<model>`` at ``TINY`` sizes, fp32, one pass, lr 1e-3."""
    cfg = compose_cfg(f"model=stock/{model}", "device=cpu", "dtype=fp32", *(f"model.{k}={v}" for k, v in TINY.items()))
    model_cfg = OmegaConf.to_container(cfg, resolve=True)["model"]
    return load_adapter({**model_cfg, "recycles": 0, "checkpointing": False, "lr": 1e-3, **kwargs})


def blocks_of(adapter, trunk) -> list[torch.nn.Module]:
    return list(getattr(trunk, adapter.blocks_attr))


@pytest.mark.parametrize("model", MODELS)
def test_cp_above_one_is_a_one_line_error_naming_the_single_gpu_baseline(model):
    with pytest.raises(ConfigError) as err:
        resolve_point(compose_cfg(f"model=stock/{model}", "device=cpu", "cp=2"))
    assert err.value.key == "cp" and "single-GPU baseline: cp=1 only" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("model", MODELS)
def test_a_missing_package_is_one_line_naming_the_install_command(model, monkeypatch):
    monkeypatch.setitem(sys.modules, STOCK_PACKAGES[model].trunk_module, None)  # "not installed"
    with pytest.raises(ConfigError) as err:
        resolve_point(compose_cfg(f"model=stock/{model}", "device=cpu", "cp=1"))
    text = str(err.value)
    assert err.value.key == "model" and text.startswith(f"model=stock/{model}: {STOCK_PACKAGES[model].trunk_module}")
    assert text.endswith(f"with: bash scripts/install_stock.sh {model}") and "\n" not in text


def test_cli_says_cp2_is_not_for_a_stock_model_in_one_line_before_any_job(tmp_path):
    proc = run_cpbench(["model=stock/boltz2", "device=cpu", "cp=2", f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path,
                       timeout_s=120)
    assert proc.returncode == 2 and not (tmp_path / "run" / "result.json").exists()
    assert proc.stderr.strip().startswith("cpbench: error: cp=2: model=stock/boltz2 is the stock Boltz-2 trunk")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_nested_model_options_are_known_to_the_group_check():
    check_group_choices(["model=stock/boltz2,stock/openfold3,stock/protenix"])
    with pytest.raises(ConfigError) as err:
        check_group_choices(["model=stock/alphafold3"])
    assert "stock/boltz2" in err.value.allowed and "pairformer" in err.value.allowed


@pytest.mark.parametrize("model", [pytest.param(m, marks=needs(m)) for m in MODELS])
def test_cp_auto_is_one_and_kernels_auto_is_torch_on_a_cpu(model):
    point = resolve_point(compose_cfg(f"model=stock/{model}", "device=cpu"))
    assert point.cp == 1 and point.mesh_shape == (1,)
    with pytest.raises(ConfigError) as err:
        resolve_point(compose_cfg(f"model=stock/{model}", "device=cpu", "model.kernels=flex"))
    assert err.value.key == "model.kernels" and "torch" in err.value.allowed


def test_stock_model_of_tells_stock_targets_from_others():
    assert stock_model_of({"_target_": "cpbench.models.stock.boltz2.Boltz2Adapter"}).title == "Boltz-2"
    assert stock_model_of({"_target_": "cpbench.models.pairformer.adapter.PairformerAdapter"}) is None
    assert stock_model_of(None) is None


def test_protenix_inference_chunks_follow_its_token_thresholds():
    assert [inference_chunk_size(n) for n in (512, 1024, 1025, 1536, 2048, 2560, 2561, 12000)] == \
        [None, None, 512, 512, 256, 128, 32, 32]


@pytest.mark.parametrize("model", [pytest.param(m, marks=needs(m)) for m in MODELS])
def test_run_blocks_runs_only_the_first_blocks_and_keeps_every_weight(model):
    adapter = tiny_adapter(model)
    torch.manual_seed(0)
    trunk = adapter.build_model(None, torch.device("cpu"))
    batch = adapter.build_batch(24, 192, 1, None, torch.device("cpu"))
    blocks, n_params = blocks_of(adapter, trunk), sum(p.numel() for p in trunk.parameters())
    calls: list[int] = []
    for i, block in enumerate(blocks):
        block.register_forward_hook(lambda *_, i=i: calls.append(i))
    assert adapter.run_step(trunk, batch, train=False, run_blocks=2) is None
    assert sorted(set(calls)) == [0, 1]  # OpenFold3's chunk-size tuner also runs block 0 on its own
    assert blocks_of(adapter, trunk) == blocks and sum(p.numel() for p in trunk.parameters()) == n_params
    calls.clear()
    adapter.run_step(trunk, batch, train=False)
    assert sorted(set(calls)) == [0, 1, 2]
    assert adapter.stats()["kernels"] == "torch" and adapter.stats()["stage_ms"]["trunk"] > 0


@pytest.mark.parametrize("model", [pytest.param(m, marks=needs(m)) for m in MODELS])
def test_every_inference_pass_works_on_a_copy_beside_the_inputs(model):
    """As in the projects, where ``z_init`` and the recycled ``z = z_init + proj(z)`` live together
    during a pass, each pass gets its own pair tensor beside the batch's (which stays unchanged)."""
    adapter = tiny_adapter(model, recycles=1)
    trunk = adapter.build_model(None, torch.device("cpu"))
    batch = adapter.build_batch(16, 128, 1, None, torch.device("cpu"))
    z0, seen = batch.z.clone(), []
    forward = adapter.forward
    adapter.forward = lambda trunk, s, z, batch, train: (seen.append(z.data_ptr()), forward(trunk, s, z, batch, train))[1]
    adapter.run_step(trunk, batch, train=False)
    assert len(seen) == 2 and batch.z.data_ptr() not in seen  # recycles=1: two passes, each on a copy
    assert torch.equal(batch.z, z0)
    seen.clear()
    adapter.run_step(trunk, batch, train=False, run_blocks=1)
    assert len(seen) == 1  # the probe's depth k also bounds the passes (time, not memory)


@pytest.mark.parametrize("model", [pytest.param(m, marks=needs(m)) for m in MODELS])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_training_step_updates_every_block_and_returns_a_finite_loss(model, checkpointing):
    adapter = tiny_adapter(model, checkpointing=checkpointing)
    torch.manual_seed(0)
    trunk = adapter.build_model(None, torch.device("cpu"))
    batch = adapter.build_batch(16, 128, 1, None, torch.device("cpu"))
    before = [[p.detach().clone() for p in block.parameters()] for block in blocks_of(adapter, trunk)]
    first = adapter.run_step(trunk, batch, train=True)
    second = adapter.run_step(trunk, batch, train=True)
    assert math.isfinite(float(first)) and math.isfinite(float(second)) and float(first) != float(second)
    for old, block in zip(before, blocks_of(adapter, trunk)):
        assert any(not torch.equal(o, p) for o, p in zip(old, block.parameters()))  # AdamW moved each block
    assert set(adapter.stats()["stage_ms"]) == {"forward", "backward_optimizer"}


@needs("openfold3")
def test_openfold3_predicts_with_tf32_matmuls_and_trains_without():
    adapter = tiny_adapter("openfold3")
    seen = []
    with adapter._precision(torch.device("cpu"), train=False):
        seen.append(torch.get_float32_matmul_precision())
    with adapter._precision(torch.device("cpu"), train=True):
        seen.append(torch.get_float32_matmul_precision())
    assert seen == ["high", "highest"] and torch.get_float32_matmul_precision() == "highest"


@needs("protenix")
def test_protenix_imports_without_building_its_cuda_layer_norm():
    """Protenix JIT-compiles a CUDA layer norm while importing unless LAYERNORM_TYPE says
    otherwise; the adapter's import must leave it alone (this machine has no nvcc)."""
    module = importlib.import_module(STOCK_PACKAGES["protenix"].trunk_module)
    assert "protenix.model.layer_norm.layer_norm" not in sys.modules, module


@pytest.mark.parametrize("model", [pytest.param(m, marks=needs(m)) for m in MODELS])
def test_bf16_inputs_are_what_an_embedder_gives_under_autocast_and_both_steps_run(model):
    """Under bf16-mixed the projects' embedders are nn.Linear under autocast: s and z reach the
    trunk in bf16 (fp32 inputs would count z_init at twice its size); the masks stay fp32."""
    adapter = tiny_adapter(model, dtype="bf16")
    trunk = adapter.build_model(None, torch.device("cpu"))
    batch = adapter.build_batch(16, 128, 1, None, torch.device("cpu"))
    assert (batch.s.dtype, batch.z.dtype, batch.mask.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)
    assert all(p.dtype == torch.float32 for p in trunk.parameters())  # mixed precision keeps fp32 weights
    assert adapter.run_step(trunk, batch, train=False) is None
    assert math.isfinite(float(adapter.run_step(trunk, batch, train=True)))


@needs("boltz2")
def test_boltz2_weights_are_drawn_by_torch_from_boltz_s_own_truncated_normal():
    """``torch_truncnorm``: the LeCun/He init of Boltz's layers, drawn by torch instead of scipy,
    has Boltz's distribution (variance 1/fan_in, cut at two standard deviations of the normal it
    truncates), and Boltz's own function is back afterwards."""
    import importlib

    from cpbench.models.stock.boltz2 import torch_truncnorm

    initialize = importlib.import_module("boltz.model.layers.initialize")
    original = initialize.trunc_normal_init_
    torch.manual_seed(0)
    ours, theirs = torch.empty(512, 256), torch.empty(512, 256)
    with torch_truncnorm(initialize):
        initialize.lecun_normal_init_(ours)
    assert initialize.trunc_normal_init_ is original
    initialize.lecun_normal_init_(theirs)  # scipy, as Boltz draws it
    target = (1 / 256) ** 0.5
    for w in (ours, theirs):
        assert w.std().item() == pytest.approx(target, rel=0.02) and abs(w.mean().item()) < 0.01 * target
    cut = 2 * target / float(initialize.truncnorm.std(a=-2, b=2))
    assert ours.abs().max().item() <= cut + 1e-6 and theirs.abs().max().item() <= cut + 1e-6
    assert ours.abs().max().item() > 0.95 * cut  # the cut is where Boltz's is, not tighter
