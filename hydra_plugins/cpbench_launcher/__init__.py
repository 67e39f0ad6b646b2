"""Hydra plugin package of cpbench: Hydra instantiates launchers only from ``hydra_plugins.*``."""
