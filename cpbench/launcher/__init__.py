"""The former home of the SLURM launcher, kept for ``python -m cpbench.launcher.collect``; the
code is ``cpbench.sweep``."""
