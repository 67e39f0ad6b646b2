"""Inference as users run it, through the reference adapter (cp=1, in process): trunk then
diffusion sampling by default, per-stage times, the trunk-only variant, the probe's shortened
sampler."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from cpbench.models.api import load_adapter
from cpbench.models.pairformer.adapter import PairformerAdapter

from helpers.run import compose_cfg

TINY = dict(c_s=16, c_z=8, blocks=2, heads_single=2, heads_tri=2, head_dim_tri=4, transition_factor=2,
            c_atom=8, c_atompair=4, atom_blocks=1, atom_heads=2, c_m=4, msa_blocks=1)
DIFFUSION = dict(c_token=16, blocks=3, heads=2, c_atom=8, c_atompair=4, atom_blocks=1, atom_heads=2, c_fourier=8)
CPU = torch.device("cpu")


def _step(sampling: bool, steps: int = 3, run_blocks: int | None = None) -> tuple[PairformerAdapter, torch.nn.Module, dict]:
    """One inference step at N=24; returns the adapter, the model and the denoiser call count."""
    torch.manual_seed(0)
    adapter = PairformerAdapter(**TINY, dtype="fp32", recycles=1, sampling=sampling, sampling_steps=steps,
                                samples=2, diffusion=DIFFUSION)
    model = adapter.build_model(None, CPU)
    batch = adapter.build_batch(24, 24 * 6, 4, None, CPU)
    calls = {"denoiser": 0, "token_blocks": 0}
    if model.diffusion is not None:
        model.diffusion.register_forward_hook(lambda *_: calls.__setitem__("denoiser", calls["denoiser"] + 1))
        for block in model.diffusion.token_blocks:
            block.register_forward_hook(lambda *_: calls.__setitem__("token_blocks", calls["token_blocks"] + 1))
    assert adapter.run_step(model, batch, train=False, run_blocks=run_blocks) is None
    return adapter, model, calls


def test_inference_workflow_samples_200_steps_of_5_samples_by_default():
    cfg = compose_cfg("device=cpu", "model=tiny")
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    adapter = load_adapter(model_cfg)
    assert (adapter.sampling, adapter.sampling_steps, adapter.samples) == (True, 200, 5)
    assert adapter.recycles == 3
    trunk_only = load_adapter(OmegaConf.to_container(
        compose_cfg("device=cpu", "model=tiny", "workflow.sampling=false").model, resolve=True))
    assert trunk_only.sampling is False
    boltz2 = OmegaConf.to_container(compose_cfg("device=cpu", "model=boltz2").model, resolve=True)
    assert (boltz2["diffusion"]["blocks"], boltz2["diffusion"]["heads"], boltz2["diffusion"]["c_token"]) == (24, 16, 768)


def test_inference_step_reports_embedding_msa_trunk_and_sampling_times():
    adapter, model, calls = _step(sampling=True, steps=3)
    stage_ms = adapter.stats()["stage_ms"]
    assert {"embedding", "msa", "trunk", "sampling"} <= set(stage_ms)  # TINY has an MSA module
    assert all(stage_ms[k] > 0 for k in ("embedding", "msa", "trunk", "sampling")), stage_ms
    assert calls == {"denoiser": 3, "token_blocks": 3 * DIFFUSION["blocks"]}


def test_sampling_false_keeps_the_trunk_only_step():
    adapter, model, calls = _step(sampling=False)
    assert model.diffusion is None
    stage_ms = adapter.stats()["stage_ms"]
    assert "sampling" not in stage_ms and {"embedding", "trunk"} <= set(stage_ms)


def test_probe_depth_cuts_sampler_steps_and_token_blocks():
    _, _, calls = _step(sampling=True, steps=50, run_blocks=2)
    assert calls == {"denoiser": 2, "token_blocks": 2 * 2}


def test_probe_depth_cuts_recycling_passes():
    """``run_blocks=k`` runs one trunk pass whatever k (recycling updates z in place, so every
    pass repeats the first's allocations); the full step runs ``recycles + 1``."""
    torch.manual_seed(0)
    adapter = PairformerAdapter(**TINY, dtype="fp32", recycles=3, sampling=False)
    model = adapter.build_model(None, CPU)
    batch = adapter.build_batch(24, 24 * 6, 4, None, CPU)
    passes = []
    model.blocks[0].register_forward_hook(lambda *_: passes.append(1))
    for run_blocks, expected in ((1, 1), (2, 1), (None, 4)):
        passes.clear()
        adapter.run_step(model, batch, train=False, run_blocks=run_blocks)
        assert len(passes) == expected, (run_blocks, len(passes))
