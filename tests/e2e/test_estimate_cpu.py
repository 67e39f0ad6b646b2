"""cpbench.estimate against real CPU timing runs: hold one N back, predict it from the others.

The peak is asserted within 15 % of the held-back measurement, and an input outside the fitted
range is marked extrapolated. The time prediction is not asserted: on the 2-core CPU the tiny
trunk's medians are not a smooth function of N (a CI rehearsal measured 15.5, 24.6, 59.8 and
72.7 ms at N=48, 64, 96, 128; every smooth model through 48, 64, 128 gives ~45 ms at 96, 26 %
below), so issue #21's 25 % time criterion is not demonstrated on a CPU and stays open.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from helpers.run import REPO_ROOT, run_cpbench

pytestmark = pytest.mark.slow
HELD_OUT = 96


def test_estimate_of_a_held_back_n_is_within_15_percent_of_its_peak(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cpbench(["-m", "routine=timing", "model=tiny", "device=cpu", "cp=1", "N=48,64,96,128", "dtype=fp32",
                        "workflow.sampling=false", "workflow.recycles=0", "model.blocks=1", "model.msa_blocks=0",
                        f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = sorted(sweep.rglob("result.json"))
    records = {json.loads(p.read_text())["point"]["N"]: p for p in results}
    fitted = tmp_path / "fitted"
    for n, path in records.items():
        if n != HELD_OUT:
            (fitted / str(n)).mkdir(parents=True)
            shutil.copy(path, fitted / str(n) / "result.json")
    held = json.loads(records[HELD_OUT].read_text())
    inp = tmp_path / "held.fasta"
    inp.write_text(">A|protein|empty\n" + "A" * HELD_OUT + "\n")
    out = subprocess.run([sys.executable, "-m", "cpbench.estimate", str(inp), "--from", str(fitted), "--json"],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)["answers"][0]
    assert answer["peak_gib"]["source"] == "predicted"
    assert answer["peak_gib"]["value"] == pytest.approx(held["peak_alloc_gib"], rel=0.15)
    far = tmp_path / "far.fasta"
    far.write_text(">A|protein|empty\n" + "A" * 400 + "\n")
    text = subprocess.run([sys.executable, "-m", "cpbench.estimate", str(far), "--from", str(fitted)],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert text.returncode == 0 and "extrapolated" in text.stdout
