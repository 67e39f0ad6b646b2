"""An adapter that counts no collectives gets them counted by the harness: one untimed step after
the timed ones, under ``cpbench.harness.collectives.CollectiveCounter``, whose counts the link model
prices (``comm_model``) as it prices the reference trunk's own. The test adapter's step is one
all-reduce of its fp32 loss; in an emulated point (fake process group, cp=4) the same."""

from __future__ import annotations

import pytest

from cpbench.results import iter_results

from helpers.run import run_cpbench

ADAPTER = ["model=adapter", "model._target_=tests.helpers.faults.FaultAdapter", "+model.fault=none", "device=cpu",
           "routine=timing", "N=32"]


@pytest.mark.parametrize("cp, emulate", [(2, False), (4, True)], ids=["cp2", "cp4-emulated"])
def test_the_harness_counts_an_adapters_collectives(tmp_path, cp, emulate):
    run_dir = tmp_path / "run"
    proc = run_cpbench([*ADAPTER, f"cp={cp}", f"emulate={str(emulate).lower()}", f"hydra.run.dir={run_dir}"],
                       cwd=tmp_path, timeout_s=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = [r for _, r in iter_results(run_dir)]
    assert record["status"] == "ok", record["message"]
    stats = record["stats"]
    # one all-reduce of a 4-byte loss over cp ranks: 2(P-1)/P of it sent, as comm.py counts
    assert stats["comm_step"] == {"all_reduce": {"calls": 1, "bytes": int(2 * (cp - 1) / cp * 4)}}, stats
    assert stats["comm_counted_by"].startswith("harness") and "comm_count_error" not in stats
    assert record["comm_model"]["comm_ms_per_kind"].keys() == {"all_reduce"}, record["comm_model"]
    assert len(record["times_ms"]) == 5  # the counting step is not a timed one
