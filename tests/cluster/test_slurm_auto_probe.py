"""routine=auto under SLURM (#19): jobs of one configuration that run at the same time take the
probe's lock once; exactly one of them runs the configuration's max-N probe.

Like test_slurm_cluster.py (whose fixtures and helpers this reuses): a one-node CPU cluster
started by .ci/slurm_up.sh, the test adapter, a frozen copy of the code. The CI node has 2 CPUs,
so the configuration is cp=1 (four one-CPU jobs, two running at a time; array parallelism 4);
the adapter never fails at cp=1, so probe.max_points keeps the probe short (its max N is a
lower bound: this test is about who runs the probe, tests/e2e/test_headline.py about its answer).
"""

from __future__ import annotations

import json

import pytest
from cluster.test_slurm_cluster import _cluster, _cpbench, _finish, code_snapshot  # noqa: F401 - fixtures

from helpers.run import fault_model

pytestmark = pytest.mark.slurm
NS = (16, 24, 32, 40)


def test_slurm_jobs_of_one_configuration_run_its_probe_once(tmp_path, code_snapshot):  # noqa: F811
    sweep_dir = tmp_path / "sweep"
    args = ["cp=1", f"N={','.join(map(str, NS))}", "probe.start=8", "probe.max_points=4", *fault_model("none"),
            "hydra.launcher.array_parallelism=4", f"hydra.sweep.dir={sweep_dir}", "report.out=null"]
    _finish(_cpbench(args, tmp_path, code_snapshot))

    timings = [json.loads((sweep_dir / str(num) / "result.json").read_text()) for num in range(len(NS))]
    assert [t["status"] for t in timings] == ["ok"] * len(NS), [t.get("message") for t in timings]
    assert [t["routine"] for t in timings] == ["timing"] * len(NS)
    assert len({t["probe"]["signature"] for t in timings}) == 1
    assert sum(t["probe"]["ran_here"] for t in timings) == 1, [t["probe"] for t in timings]
    probes = sorted((sweep_dir / "probes").glob("*/result.json"))
    assert len(probes) == 1 and len(list((sweep_dir / "probes").glob("*.lock"))) == 1
    probe = json.loads(probes[0].read_text())
    assert probe["routine"] == "probe" and probe["status"] == "ok" and probe["max_n"] is not None
    assert len(probe["points"]) == 4  # one search, not one per job
