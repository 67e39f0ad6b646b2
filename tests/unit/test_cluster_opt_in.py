"""The SLURM tests (``tests/cluster/``) never reach a cluster without ``CPBENCH_TEST_SLURM=1``,
even where ``sinfo`` answers with an idle node (a developer's or a user's own cluster)."""

from __future__ import annotations

import os

import pytest

from helpers.cluster import OPT_IN, cluster_skip_reason
from helpers.fake_slurm import fake_slurm_bin


@pytest.fixture
def answering_sinfo(tmp_path, monkeypatch):
    """A fake ``sinfo`` (and ``sbatch``) first on PATH; ``sinfo`` reports one idle node."""
    bin_dir, _ = fake_slurm_bin(tmp_path, sinfo_lines="idle")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("opt_in", [None, "", "0", "yes"])
def test_cluster_tests_skip_without_the_opt_in_although_sinfo_answers(answering_sinfo, monkeypatch, opt_in):
    if opt_in is None:
        monkeypatch.delenv(OPT_IN, raising=False)
    else:
        monkeypatch.setenv(OPT_IN, opt_in)
    reason = cluster_skip_reason()
    assert reason is not None and f"{OPT_IN}=1" in reason and "\n" not in reason


def test_cluster_tests_run_with_the_opt_in_where_a_node_answers(answering_sinfo, monkeypatch):
    monkeypatch.setenv(OPT_IN, "1")
    assert cluster_skip_reason() is None
