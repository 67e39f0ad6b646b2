"""A worker process starts for every probe point and timing run: what it imports before its
first step is paid per point (``python -m cpbench.harness.worker``)."""

from __future__ import annotations

import subprocess
import sys

# The CLI's config stack: a worker reads a JSON spec and needs none of it.
NOT_IN_A_WORKER = ("omegaconf", "hydra", "antlr4", "cpbench.config", "cpbench.job", "cpbench.routines")


def test_the_worker_module_does_not_import_the_config_stack():
    script = ("import sys, cpbench.harness.worker\n"
              f"print(sorted(m for m in sys.modules if m.split('.')[0] in {NOT_IN_A_WORKER!r} "
              f"or m.startswith({NOT_IN_A_WORKER!r})))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_reference_adapter_does_not_import_the_compiler():
    """torch._dynamo costs a process ~0.9 s and 69 MiB: only a compiled (flex, CUDA) run loads it."""
    script = ("import sys, cpbench.models.pairformer.adapter\n"
              "print('torch._dynamo' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"
