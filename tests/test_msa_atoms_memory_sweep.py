"""The input axes S (MSA depth) and N_atoms move peak memory: a real CPU timing multirun of the
tiny reference trunk over ``S=16,256 x N_atoms=256,512``, checked from its ``result.json`` files.

Kept cheap: N=32, fp32, trunk only (no diffusion sampling, no recycling). On CPU the peak is
the worker's resident-set high-water mark above its baseline (``cpbench.memory``), about 16 MB
of which is the same at every point; at this N the MSA tensors of S=64 (~0.5 MB) are within
that noise, so the S step is 16 -> 256 (MSA phase ~+2 MB), N_atoms 256 -> 512 gives ~+1 MB.
"""

from __future__ import annotations

import json

import pytest

from conftest import reference_adapter_missing, run_cpbench

SWEEP_ARGS = ["-m", "S=16,256", "N_atoms=256,512", "model=tiny", "device=cpu", "routine=timing", "N=32", "cp=1",
              "dtype=fp32", "workflow.sampling=false", "workflow.recycles=0"]


def test_peak_memory_grows_with_msa_depth_and_with_atoms(tmp_path):
    reason = reference_adapter_missing()
    if reason:
        pytest.skip(reason)
    sweep_dir = tmp_path / "sweep"
    proc = run_cpbench([*SWEEP_ARGS, f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path, timeout_s=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak_gib = {}
    for path in sweep_dir.rglob("result.json"):
        record = json.loads(path.read_text())
        assert record["status"] == "ok", (path, record.get("message"))
        peak_gib[(record["point"]["S"], record["point"]["N_atoms"])] = record["peak_alloc_gib"]
    assert sorted(peak_gib) == [(16, 256), (16, 512), (256, 256), (256, 512)]
    for n_atoms in (256, 512):
        assert peak_gib[(256, n_atoms)] > peak_gib[(16, n_atoms)], ("S", n_atoms, peak_gib)
    for s in (16, 256):
        assert peak_gib[(s, 512)] > peak_gib[(s, 256)], ("N_atoms", s, peak_gib)
