"""The class ``hydra/launcher=slurm`` names; the implementation is ``cpbench.sweep.slurm``.

Hydra only instantiates plugins defined under the ``hydra_plugins`` namespace package, so
this module holds nothing but the name. It is imported at every Hydra start (plugin
discovery): keep it free of heavy imports (torch, submitit).
"""

from cpbench.sweep.slurm import GroupedSlurmLauncher


class CpbenchSlurmLauncher(GroupedSlurmLauncher):
    """One SLURM job per sweep point, grouped into job arrays by resources (see the base class)."""
