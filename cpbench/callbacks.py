"""The path ``conf/config.yaml`` (and users' configs) name for the callbacks: ``cpbench.callbacks.CpbenchCallback``.
The implementation is ``cpbench.sweep.callbacks``."""

from cpbench.sweep.callbacks import CpbenchCallback

__all__ = ["CpbenchCallback"]
