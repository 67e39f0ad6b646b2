"""What a routine runs on: one point's worker processes and their verdict.

* ``slots``: the rank slots this process supervises (local, torchrun, SLURM) and the
  supervisors' CPU group.
* ``runner``: starts a fresh worker per rank for one probe point or timing run, waits, kills
  on failure or timeout, and agrees on the verdict (``ok``, ``oom``, ``timeout``, ``error``).
* ``worker``: one rank's process (``python -m cpbench.harness.worker``).
* ``memory``: per-rank memory caps and peaks; ``env``: run metadata (versions, GPU, CPU).
"""
