"""``-m experiment=headline`` runs every configuration the README's table reports (cpbench/conf/headline/),
each one alone as ``headline=<name>``."""

from __future__ import annotations

from omegaconf import OmegaConf

from cpbench.config import CONF_DIR, emulate_enabled

from helpers.run import compose_cfg

ROWS = sorted(p.stem for p in (CONF_DIR / "headline").glob("*.yaml"))


def test_the_headline_experiment_sweeps_every_row_once():
    swept = OmegaConf.load(CONF_DIR / "experiment" / "headline.yaml").hydra.sweeper.params.headline.split(",")
    assert sorted(swept) == ROWS and len(swept) == len(set(swept))


def test_every_row_composes_to_its_configuration():
    seen = set()
    for name in ROWS:
        cfg = compose_cfg(f"headline={name}")
        emulated = emulate_enabled(OmegaConf.to_container(cfg.emulate))
        assert emulated == name.endswith("_emulated"), name
        assert (cfg.routine == "timing") == name.startswith("pass_"), name  # a pass is timed, not probed
        key = (cfg.model.name, cfg.workflow.name, cfg.workflow.sampling, cfg.topology.name, cfg.cp, emulated,
               cfg.model.get("msa_blocks"), cfg.N)
        assert key not in seen, name  # no two rows measure the same thing
        seen.add(key)
