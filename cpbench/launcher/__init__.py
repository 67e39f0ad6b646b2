"""The SLURM launcher (``hydra/launcher=slurm``): one job per sweep point, arrays by resources.

* ``resources``: cp -> nodes, tasks per node, GPUs per node.
* ``slurm``: the Hydra launcher (submission, and the per-task entry point on the nodes).
* ``collect``: waiting for the jobs; a job SLURM killed becomes a result row.
* ``slurm_state``: job states from sacct, or scontrol where there is no accounting.

Hydra finds the launcher through ``hydra_plugins/cpbench_launcher`` (plugin discovery).
"""
