"""Residue vocabulary shared by synthetic and real inputs: AF3 residue classes and heavy atoms.

``RESTYPES`` is AF3's 32-class residue alphabet (the ``restype`` one-hot and the MSA alphabet):
20 amino acids, unknown amino acid, 4 RNA + unknown RNA, 4 DNA + unknown DNA, gap.

``HEAVY_ATOMS`` counts the heavy atoms of each standard polymer residue as it sits in a chain,
i.e. its reference conformer without hydrogens and without leaving atoms (OXT of an amino acid,
OP3 of a nucleotide) -- the atoms AF3 and Boltz give one standard-residue token.
"""

from __future__ import annotations

# AF3 residue classes (index = class id). Amino acids in the AlphaFold order (ARNDCQEGHILKMFPSTWYV).
RESTYPES: tuple[str, ...] = (
    "ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU", "GLY", "HIS", "ILE",
    "LEU", "LYS", "MET", "PHE", "PRO", "SER", "THR", "TRP", "TYR", "VAL",
    "UNK",                       # 20: unknown amino acid
    "A", "G", "C", "U", "N",     # 21-25: RNA, N = unknown RNA
    "DA", "DG", "DC", "DT", "DN",  # 26-30: DNA, DN = unknown DNA
    "-",                         # 31: gap (MSA) / padding
)
NUM_RESTYPES = len(RESTYPES)
RESTYPE_INDEX = {name: i for i, name in enumerate(RESTYPES)}
NUM_AMINO_ACIDS = 20
GAP_INDEX = RESTYPE_INDEX["-"]

# Molecule types (the ``mol_type`` token feature).
MOL_PROTEIN, MOL_DNA, MOL_RNA, MOL_LIGAND = 0, 1, 2, 3

# One-letter codes of sequences in FASTA / Boltz YAML, per polymer kind -> residue name.
PROTEIN_LETTERS = {
    "A": "ALA", "R": "ARG", "N": "ASN", "D": "ASP", "C": "CYS", "Q": "GLN", "E": "GLU",
    "G": "GLY", "H": "HIS", "I": "ILE", "L": "LEU", "K": "LYS", "M": "MET", "F": "PHE",
    "P": "PRO", "S": "SER", "T": "THR", "W": "TRP", "Y": "TYR", "V": "VAL", "X": "UNK",
}
RNA_LETTERS = {"A": "A", "G": "G", "C": "C", "U": "U", "N": "N"}
DNA_LETTERS = {"A": "DA", "G": "DG", "C": "DC", "T": "DT", "N": "DN"}
LETTERS_BY_KIND = {"protein": PROTEIN_LETTERS, "rna": RNA_LETTERS, "dna": DNA_LETTERS}

_BACKBONE_AA = 4  # N, CA, C, O
_SUGAR_PHOSPHATE_RNA = 12  # P OP1 OP2 O5' C5' C4' O4' C3' O3' C2' O2' C1'
_SUGAR_PHOSPHATE_DNA = 11  # as RNA without O2'
_BASE = {"A": 10, "G": 11, "C": 8, "U": 8, "T": 9}  # purine/pyrimidine ring atoms + substituents

HEAVY_ATOMS: dict[str, int] = {
    "ALA": _BACKBONE_AA + 1, "ARG": _BACKBONE_AA + 7, "ASN": _BACKBONE_AA + 4,
    "ASP": _BACKBONE_AA + 4, "CYS": _BACKBONE_AA + 2, "GLN": _BACKBONE_AA + 5,
    "GLU": _BACKBONE_AA + 5, "GLY": _BACKBONE_AA + 0, "HIS": _BACKBONE_AA + 6,
    "ILE": _BACKBONE_AA + 4, "LEU": _BACKBONE_AA + 4, "LYS": _BACKBONE_AA + 5,
    "MET": _BACKBONE_AA + 4, "PHE": _BACKBONE_AA + 7, "PRO": _BACKBONE_AA + 3,
    "SER": _BACKBONE_AA + 2, "THR": _BACKBONE_AA + 3, "TRP": _BACKBONE_AA + 10,
    "TYR": _BACKBONE_AA + 8, "VAL": _BACKBONE_AA + 3,
    "UNK": _BACKBONE_AA + 1,  # Boltz/AF3 model an unknown amino acid as N CA C O CB
    "A": _SUGAR_PHOSPHATE_RNA + _BASE["A"], "G": _SUGAR_PHOSPHATE_RNA + _BASE["G"],
    "C": _SUGAR_PHOSPHATE_RNA + _BASE["C"], "U": _SUGAR_PHOSPHATE_RNA + _BASE["U"],
    "N": _SUGAR_PHOSPHATE_RNA,  # unknown RNA: sugar-phosphate only
    "DA": _SUGAR_PHOSPHATE_DNA + _BASE["A"], "DG": _SUGAR_PHOSPHATE_DNA + _BASE["G"],
    "DC": _SUGAR_PHOSPHATE_DNA + _BASE["C"], "DT": _SUGAR_PHOSPHATE_DNA + _BASE["T"],
    "DN": _SUGAR_PHOSPHATE_DNA,
}
STANDARD_RESIDUES = frozenset(HEAVY_ATOMS)
