"""Real inputs (``dataset=real dataset.inputs=FILE``): the sizes (N, N_atoms, S) of one input.

Readers by suffix: Boltz YAML (``.yaml``/``.yml``), FASTA (``.fasta``/``.fa``/``.faa``/``.fas``)
with A3M files for the MSA depth, mmCIF / PDB (``.cif``/``.mmcif``/``.pdb``/``.ent``, optionally
``.gz``) through gemmi. Sizes follow AF3 tokenisation (``cpbench.data.tokenize``); S is the
deepest chain MSA (query included; 1 without MSA -- paired and unpaired rows share rows, as
in Boltz and AF3), capped at ``dataset.max_msa_seqs``.

``dataset.inputs`` is a path (absolute, or relative to the launch directory); a bare name of a
shipped input (``ubiquitin.fasta``, see ``SHIPPED_INPUTS``) works from anywhere.

Usage::

    sizes = resolve_input_sizes({"inputs": "ubiquitin.fasta", "ccd": None})
    sizes.N, sizes.N_atoms, sizes.S   # 76, 601, 8
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from cpbench.data.boltz_yaml import read_boltz_yaml
from cpbench.data.chem import ComponentsDictionary
from cpbench.data.fasta import read_fasta
from cpbench.data.structure import read_structure
from cpbench.data.tokenize import InputError

SHIPPED_INPUTS = Path(__file__).parent / "inputs"
DEFAULT_MAX_MSA_SEQS = 16384  # AF3 and Boltz use at most this many MSA rows

READERS = {
    ".yaml": "boltz", ".yml": "boltz",
    ".fasta": "fasta", ".fa": "fasta", ".faa": "fasta", ".fas": "fasta",
    ".cif": "structure", ".mmcif": "structure", ".pdb": "structure", ".ent": "structure",
}

__all__ = ["InputError", "InputSizes", "SHIPPED_INPUTS", "resolve_input_sizes", "locate_input"]


@dataclass(frozen=True)
class InputSizes:
    """One real input: its name (the file name) and sizes."""

    name: str
    N: int  # tokens
    N_atoms: int  # heavy atoms
    S: int  # MSA rows, query included


def resolve_input_sizes(dataset_cfg: Mapping[str, Any]) -> InputSizes:
    """Sizes of the input named by a ``dataset=real`` config (``inputs``, ``ccd``, ``max_msa_seqs``).

    Raises:
        InputError: one line naming the file and the field or line (or the config key).
    """
    cfg = _plain(dataset_cfg)
    inputs = cfg.get("inputs")
    if isinstance(inputs, (list, tuple)):
        raise InputError("dataset.inputs", "one file per job; sweep several with -m dataset.inputs=a.yaml,b.fasta")
    if inputs in (None, "", "???"):
        raise InputError("dataset.inputs", f"required with dataset=real: a file ending in {', '.join(READERS)}")
    path = locate_input(str(inputs))
    ccd = ComponentsDictionary(cfg.get("ccd") or None)
    reader = READERS[_suffix(path)]
    if reader == "boltz":
        sizes, depth = read_boltz_yaml(path, ccd)
    elif reader == "fasta":
        sizes, depth = read_fasta(path, ccd)
    else:
        sizes, depth = read_structure(path)
    max_msa = cfg.get("max_msa_seqs") or DEFAULT_MAX_MSA_SEQS
    return InputSizes(name=path.name, N=sizes.tokens, N_atoms=sizes.atoms, S=min(depth, int(max_msa)))


def locate_input(name: str) -> Path:
    """The file ``name`` names: as given, else a shipped input of that name."""
    path = Path(name).expanduser()
    if not path.exists() and not path.is_absolute() and (SHIPPED_INPUTS / path).exists():
        path = SHIPPED_INPUTS / path
    if _suffix(path) not in READERS:
        raise InputError(name, f"unknown input type (dataset.inputs); expected a file ending in {', '.join(READERS)}")
    if not path.is_file():
        raise InputError(name, "no such file (dataset.inputs)")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise InputError(f"{path}", f"cannot read ({exc.strerror or exc})") from None
    return path


def _suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz" and len(suffixes) > 1:
        return suffixes[-2] if suffixes[-2] in (".cif", ".mmcif", ".pdb", ".ent") else ".gz"
    return suffixes[-1] if suffixes else ""


def _plain(cfg: Mapping[str, Any]) -> dict:
    """A plain dict of an OmegaConf node or a mapping; a missing (``???``) value stays ``"???"``."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except ImportError:
        pass
    return dict(cfg)
