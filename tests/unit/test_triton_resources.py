"""``scripts/triton_resources.py``: a Triton kernel of the trunk compiled for sm_90 on a machine
without a GPU, with the registers, spills and shared memory read from the binary. Runs where
Triton's NVIDIA backend is installed (its wheel ships ptxas and cuobjdump)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "triton_resources.py"


def _nvidia_tools() -> bool:
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    return (Path(spec.submodule_search_locations[0]) / "backends" / "nvidia" / "bin" / "cuobjdump").is_file()


@pytest.mark.skipif(not _nvidia_tools(), reason="Triton's NVIDIA backend is not installed (pip install triton)")
def test_every_kernel_compiles_for_sm90_within_its_shared_memory(tmp_path):
    """Every kernel under the launch settings in the code compiles for sm_90 and asks at most the
    227 KiB of shared memory a block may have there (a setting that asks more does not launch on
    an H100/H200). Spills are reported, not asserted: they depend on the Triton version."""
    out = tmp_path / "res.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--n", "256", "--out", str(out)], capture_output=True,
                          text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = json.loads(out.read_text())["lines"]
    assert [line["kernel"] for line in lines] == ["attention", "norm_linear", "triangle_operands", "triangle_update",
                                                  "gated_output", "swiglu_transition", "norm_linear_bwd",
                                                  "triangle_operands_bwd", "triangle_update_bwd", "gated_output_bwd",
                                                  "swiglu_transition_bwd"], lines
    for line in lines:
        assert "error" not in line, line
        assert 0 < line["regs"] <= 255 and line["spill_bytes"] >= 0 and line["shared_kib"] > 0 and line["fits_shared"], line
        assert line["mma"] in ("wgmma", "mma.sync"), line
