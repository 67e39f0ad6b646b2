"""AF3 tokenisation of real inputs into sizes (tokens, atoms), and the one-line input error.

AF3 / Boltz rule: a standard residue or nucleotide of a polymer is one token carrying its
heavy atoms (``vocab.HEAVY_ATOMS``); every heavy atom of a ligand or of a non-standard
(modified) polymer residue is a token of its own. Hydrogens never count.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpbench.data.vocab import HEAVY_ATOMS, LETTERS_BY_KIND


class InputError(ValueError):
    """A real input the user supplied is unusable; the message is one line naming the file
    and the field or line."""

    def __init__(self, where: str, problem: str):
        super().__init__(" ".join(f"{where}: {problem}".split()))


@dataclass(frozen=True)
class Sizes:
    """Token and atom counts of one chain, ligand, or whole input."""

    tokens: int = 0
    atoms: int = 0

    def __add__(self, other: "Sizes") -> "Sizes":
        return Sizes(self.tokens + other.tokens, self.atoms + other.atoms)

    def __mul__(self, copies: int) -> "Sizes":
        return Sizes(self.tokens * copies, self.atoms * copies)


def standard_residue(name: str) -> Sizes:
    """One token with the residue's heavy atoms (``name`` must be in ``HEAVY_ATOMS``)."""
    return Sizes(1, HEAVY_ATOMS[name])


def per_atom(heavy_atoms: int) -> Sizes:
    """A ligand or non-standard residue: one token per heavy atom."""
    return Sizes(heavy_atoms, heavy_atoms)


def polymer_residues(kind: str, sequence: str, where: str) -> list[str]:
    """Residue names of a one-letter ``sequence`` of ``kind`` (protein | dna | rna).

    Raises:
        InputError: an empty sequence, or a letter that is no residue of ``kind`` (with its
            1-based position).
    """
    letters = LETTERS_BY_KIND[kind]
    sequence = "".join(sequence.split()).upper()
    if not sequence:
        raise InputError(where, f"empty {kind} sequence")
    names = []
    for position, letter in enumerate(sequence, start=1):
        if letter not in letters:
            raise InputError(where, f"unknown {kind} residue {letter!r} at position {position} (allowed: {''.join(letters)})")
        names.append(letters[letter])
    return names


def read_text(path, what: str) -> str:
    """The text of an input file; an unreadable or binary file is an ``InputError``."""
    try:
        return path.read_text()
    except OSError as exc:
        raise InputError(f"{path}", f"cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}", f"not a text {what} file (byte {exc.start})") from None
