"""cpbench.estimate against real CPU timing runs: hold one N back, predict it from the others.

Peak within 15 % and time within 25 % of the held-back measurement (no absolute time is
asserted: only the model's agreement with a measurement made under the same conditions). On a
machine too busy to time (a larger N measured faster than a smaller one: the medians are noise,
seen with a load of 5-9 on 2 shared cores) the time comparison is skipped, not passed.
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


def test_estimate_of_a_held_back_n_is_within_15_percent_peak_and_25_percent_time(tmp_path):
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
    medians = [json.loads(records[n].read_text())["median_ms"] for n in sorted(records)]
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

    if any(later < earlier for earlier, later in zip(medians, medians[1:])):
        pytest.skip(f"medians not increasing with N ({', '.join(f'{m:.0f}' for m in medians)} ms): too busy to time")
    assert answer["time_ms"]["value"] == pytest.approx(held["median_ms"], rel=0.25)
