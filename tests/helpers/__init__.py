"""Test helpers: distributed spawning (``dist``), parity setups (``parity``), the fault-injecting
test adapters (``faults``), running cpbench in a subprocess (``run``), a fake SLURM on PATH
(``fake_slurm``), when the real-SLURM tests may run (``cluster``)."""
