"""Assembled modules: the Pairformer block, the MSA module, the atom encoder, the trunk, the
diffusion module and its EDM sampler."""
