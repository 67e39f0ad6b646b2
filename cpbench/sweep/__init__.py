"""The multirun controller: what happens around the jobs of a sweep.

* ``callbacks``: Hydra callbacks (validate every point before any job starts; build the report
  when the sweep ends).
* ``slurm``: the SLURM launcher (``hydra/launcher=slurm``): one job per point, job arrays
  grouped by the resources each point needs; ``resources`` (cp -> nodes, tasks, GPUs),
  ``collect`` (waiting, and rows for jobs SLURM killed), ``slurm_state`` (sacct / scontrol).

Hydra finds the launcher through ``hydra_plugins/cpbench_launcher`` (plugin discovery).
"""
