"""Test helpers: distributed spawning (``dist``), parity setups (``parity``), the fault-injecting
test adapters (``faults``), running cpbench in a subprocess (``run``)."""
