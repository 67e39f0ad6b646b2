"""The input axes S (MSA depth) and N_atoms move peak memory: a real CPU timing multirun of the
tiny reference trunk over ``S=16,1024 x N_atoms=256,4096``, checked from its ``result.json`` files.

Kept cheap: N=32, fp32, trunk only (no diffusion sampling, no recycling). On CPU the peak is
the worker's resident-set high-water mark above its baseline (``cpbench.harness.memory``), about 16 MB
of which is the same at every point; at this N the MSA tensors of S=64 (~0.5 MB) are within
that noise (as is N_atoms 256 -> 512, ~+1 MB, which once measured smaller in a loaded CI-like
run), so the steps are S 16 -> 1024 and N_atoms 256 -> 4096, each several MB.
"""

from __future__ import annotations

import json

from helpers.run import run_cpbench

SWEEP_ARGS = ["-m", "S=16,1024", "N_atoms=256,4096", "model=tiny", "device=cpu", "routine=timing", "N=32", "cp=1",
              "dtype=fp32", "workflow.sampling=false", "workflow.recycles=0"]


def test_peak_memory_grows_with_msa_depth_and_with_atoms(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_cpbench([*SWEEP_ARGS, f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path, timeout_s=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak_gib = {}
    for path in sweep_dir.rglob("result.json"):
        record = json.loads(path.read_text())
        assert record["status"] == "ok", (path, record.get("message"))
        peak_gib[(record["point"]["S"], record["point"]["N_atoms"])] = record["peak_alloc_gib"]
    assert sorted(peak_gib) == [(16, 256), (16, 4096), (1024, 256), (1024, 4096)]
    # The peak is the max over phases (atom encoder, MSA module, Pairformer), so each axis is
    # read at the other axis's low value, where its own phase sets the peak; 2 MiB clears the
    # resident-set noise.
    margin_gib = 2 / 1024
    assert peak_gib[(1024, 256)] > peak_gib[(16, 256)] + margin_gib, ("S", peak_gib)
    assert peak_gib[(16, 4096)] > peak_gib[(16, 256)] + margin_gib, ("N_atoms", peak_gib)
