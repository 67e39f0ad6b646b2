"""The CPU swap of the default reference trunk to the tiny preset's sizes keys on the model
choice: the user's ``model.*`` keys stay, an explicit ``model=pairformer`` runs the full size."""

from __future__ import annotations

import pytest

from cpbench.job import cpu_default_model

from helpers.run import compose_cfg

TINY = {"c_s": 32, "c_z": 16, "blocks": 2, "msa_blocks": 2}


def swap(*overrides: str, model_choice: str = "pairformer"):
    cfg = compose_cfg("device=cpu", *overrides)
    note = cpu_default_model(cfg, model_choice, list(overrides))
    return cfg.model, note


def test_the_default_trunk_runs_at_tiny_sizes_on_a_cpu():
    model, note = swap()
    assert {k: model[k] for k in TINY} == TINY and model.name == "tiny" and model.diffusion.c_token == 32
    assert note.startswith("model=tiny:") and "model=pairformer on the command line runs the full size" in note


@pytest.mark.parametrize("override, key, value", [
    ("model.kernels=torch", "kernels", "torch"),
    ("model.blocks=4", "blocks", 4),
    ("model.blocks=64", "blocks", 64),        # the preset's own value, named: still the user's
    ("model.diffusion.blocks=3", "diffusion.blocks", 3),
    ("+model.extra=1", "extra", 1),
])
def test_model_keys_set_on_the_command_line_survive_the_swap(override, key, value):
    from omegaconf import OmegaConf

    model, note = swap(override)
    assert OmegaConf.select(model, key) == value
    assert {k: model[k] for k in TINY if k != key} == {k: v for k, v in TINY.items() if k != key}
    assert f"keeping model.{key}" in note


def test_a_removed_model_key_stays_removed():
    model, note = swap("~model.msa_blocks")
    assert "msa_blocks" not in model and model.blocks == 2 and "model.msa_blocks" in note


def test_a_model_key_a_config_file_changed_survives_the_swap():
    cfg = compose_cfg("device=cpu")
    cfg.model.c_s = 96  # as an experiment file (# @package _global_) would set it
    note = cpu_default_model(cfg, "pairformer", [])
    assert cfg.model.c_s == 96 and cfg.model.c_z == 16 and "model.c_s" in note


@pytest.mark.parametrize("overrides, model_choice", [
    (("model=pairformer",), "pairformer"),     # asked for by name: the full size
    (("model=boltz2",), "boltz2"),
    (("device=cuda",), "pairformer"),
])
def test_no_swap_for_an_explicit_model_or_off_the_cpu(overrides, model_choice):
    cfg = compose_cfg("device=cpu", *overrides)
    assert cpu_default_model(cfg, model_choice, list(overrides)) is None
    assert cfg.model.blocks == 64 and cfg.model.c_z == 128
