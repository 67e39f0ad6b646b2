"""cpbench: max-N and walltime benchmarks for context-parallel protein-structure models."""

__version__ = "0.1.0"
