"""The headline command under SLURM: ``python -m cpbench -m hydra/launcher=slurm
workflow=training cp=... N=...``. Jobs of one configuration that run at the same time take the
probe's lock once; exactly one of them runs the configuration's max-N probe, and the sweep gives
the same answers as tests/e2e/test_headline.py: a timing row per N and one max N per cp, bounded
by a real allocation failure, named in the report's readout.

Like test_slurm_cluster.py (whose fixtures and helpers this reuses): a one-node CPU cluster
started by .ci/slurm_up.sh, a frozen copy of the code. The CI node has 2 CPUs and a job takes one
per rank, so the configuration is cp=1: its two jobs (N=16 and N=32, one array, the launcher's
default array parallelism) run at the same time, where a cp=2 job would take the whole node and
cp=4 or 8 can never start there (test_slurm_cluster.py's "cannot hold" test covers those rows).
Nothing but the output location, the launcher's poll interval and time limit, and an MSA depth of
16 (S=16, as in the headline test: the routing does not depend on S) is added to the command:
device=auto and the launcher's default gpus_per_node, so the points run on the CPU of this
GPU-less cluster and ask SLURM for no GPU. The model is the default reference trunk (its tiny
preset on a CPU) under the automatic training cap, as in the headline test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster.test_slurm_cluster import _cluster, _cpbench, _finish, code_snapshot  # noqa: F401 - fixtures

pytestmark = pytest.mark.slurm
NS = (16, 32)


def test_slurm_headline_jobs_of_one_configuration_run_its_probe_once(tmp_path, code_snapshot):  # noqa: F811
    sweep_dir = tmp_path / "sweep"
    args = ["workflow=training", "cp=1", f"N={','.join(map(str, NS))}", "S=16",
            f"hydra.sweep.dir={sweep_dir}", f"report.out={tmp_path / 'docs' / 'cp_benchmark.md'}"]
    # As a user types it: the launcher's own defaults (gpus_per_node 8, the cluster's CPUs per task) and
    # device=auto; on this GPU-less cluster the points run on the CPU and ask SLURM for no GPU.
    launcher = ["hydra/launcher=slurm", "hydra.launcher.poll_s=1", "hydra.launcher.timeout_min=10"]
    _finish(_cpbench(args, tmp_path, code_snapshot, launcher=launcher), timeout_s=600)

    timings = [json.loads((sweep_dir / str(num) / "result.json").read_text()) for num in range(len(NS))]
    assert [t["status"] for t in timings] == ["ok"] * len(NS), [t.get("message") for t in timings]
    assert [t["routine"] for t in timings] == ["timing"] * len(NS)
    assert all(t["median_ms"] > 0 and t["point"]["memory_limit_gib"] is None for t in timings)
    assert len({t["probe"]["signature"] for t in timings}) == 1
    assert sum(t["probe"]["ran_here"] for t in timings) == 1, [t["probe"] for t in timings]

    # one probe (one search, one lock), bounded by a real allocation failure
    probes = sorted((sweep_dir / "probes").glob("*/result.json"))
    assert len(probes) == 1 and len(list((sweep_dir / "probes").glob("*.lock"))) == 1
    probe = json.loads(probes[0].read_text())
    assert probe["routine"] == "probe" and probe["status"] == "ok", probe["message"]
    assert probe["max_n"] is not None and probe["first_fail_status"] == "oom", probe["message"]
    assert probe["lower_bound"] is None and probe["first_fail_n"] > probe["max_n"]
    assert probe["point"]["memory_limit_gib"] is not None and probe["point"]["device"] == "cpu"
    assert [Path(t["probe"]["path"]).resolve() for t in timings] == [probes[0].resolve()] * len(NS)

    text = (tmp_path / "docs" / "cp_benchmark.md").read_text()
    assert f"{probe['max_n']:,} at cp=1" in text, text[:3000]
