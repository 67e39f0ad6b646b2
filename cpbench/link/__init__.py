"""Interconnects: the communication model (``model``) and its calibration on a node
(``python -m cpbench.link``, ``calibrate``)."""

from cpbench.link.model import KINDS, Link, LinkError, StepRange, link_from_config, predict

__all__ = ["KINDS", "Link", "LinkError", "StepRange", "link_from_config", "predict"]
