"""Real inputs: exact AF3 sizes of every shipped input, and one-line errors for bad inputs."""

from pathlib import Path

import pytest

gemmi = pytest.importorskip("gemmi")
Chem = pytest.importorskip("rdkit.Chem")

from cpbench.data.real import SHIPPED_INPUTS, InputError, InputSizes, resolve_input_sizes  # noqa: E402
from cpbench.data.vocab import HEAVY_ATOMS, RESTYPES  # noqa: E402

CCD = str(SHIPPED_INPUTS / "ccd_sample.cif")
UBIQUITIN = "MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEGIPPDQQRLIFAGKQLEDGRTLSDYNIQKESTLHLVLRLRGG"


@pytest.mark.parametrize(
    "name, N, N_atoms, S",
    [
        ("ubiquitin.fasta", 76, 601, 8),  # FASTA + A3M; 601 = 1UBQ's 602 protein atoms less OXT
        ("hemoglobin.yaml", 574, 4380, 1),  # 2 x 141 + 2 x 146 residues
        ("hiv_protease_darunavir.yaml", 236, 1552, 1),  # 2 x 99 residues + 38 SMILES heavy atoms
        ("dna_duplex.fasta", 24, 492, 1),  # 2 x (4 DC 19 + 4 DG 22 + 2 DA 21 + 2 DT 20)
        ("ubiquitin_fragment.cif", 9, 31, 1),  # MET 8 + GLN 9 + ILE 8 (CD1 unresolved) + GOL 6
    ],
)
def test_shipped_input_has_exact_af3_sizes(name, N, N_atoms, S):
    assert resolve_input_sizes({"inputs": name}) == InputSizes(name, N, N_atoms, S)


# Free residues (with their leaving atom: OXT of an amino acid, OP3 of a nucleotide).
FREE_RESIDUE_SMILES = {
    "ALA": "CC(N)C(=O)O", "ARG": "NC(CCCNC(=N)N)C(=O)O", "ASN": "NC(CC(N)=O)C(=O)O",
    "ASP": "NC(CC(=O)O)C(=O)O", "CYS": "NC(CS)C(=O)O", "GLN": "NC(CCC(N)=O)C(=O)O",
    "GLU": "NC(CCC(=O)O)C(=O)O", "GLY": "NCC(=O)O", "HIS": "NC(Cc1c[nH]cn1)C(=O)O",
    "ILE": "CCC(C)C(N)C(=O)O", "LEU": "CC(C)CC(N)C(=O)O", "LYS": "NCCCCC(N)C(=O)O",
    "MET": "CSCCC(N)C(=O)O", "PHE": "NC(Cc1ccccc1)C(=O)O", "PRO": "OC(=O)C1CCCN1",
    "SER": "NC(CO)C(=O)O", "THR": "CC(O)C(N)C(=O)O", "TRP": "NC(Cc1c[nH]c2ccccc12)C(=O)O",
    "TYR": "NC(Cc1ccc(O)cc1)C(=O)O", "VAL": "CC(C)C(N)C(=O)O",
    "A": "Nc1ncnc2c1ncn2C1OC(COP(=O)(O)O)C(O)C1O", "G": "Nc1nc2c(ncn2C2OC(COP(=O)(O)O)C(O)C2O)c(=O)[nH]1",
    "C": "Nc1ccn(C2OC(COP(=O)(O)O)C(O)C2O)c(=O)n1", "U": "O=c1ccn(C2OC(COP(=O)(O)O)C(O)C2O)c(=O)[nH]1",
    "DA": "Nc1ncnc2c1ncn2C1CC(O)C(COP(=O)(O)O)O1", "DG": "Nc1nc2c(ncn2C2CC(O)C(COP(=O)(O)O)O2)c(=O)[nH]1",
    "DC": "Nc1ccn(C2CC(O)C(COP(=O)(O)O)O2)c(=O)n1", "DT": "Cc1cn(C2CC(O)C(COP(=O)(O)O)O2)c(=O)[nH]c1=O",
}


@pytest.mark.parametrize("residue", sorted(FREE_RESIDUE_SMILES))
def test_heavy_atom_table_is_free_residue_less_its_leaving_atom(residue):
    assert residue in RESTYPES
    mol = Chem.MolFromSmiles(FREE_RESIDUE_SMILES[residue])
    assert HEAVY_ATOMS[residue] == mol.GetNumHeavyAtoms() - 1


def test_pdb_and_gzipped_mmcif_give_the_same_sizes_as_the_mmcif(tmp_path):
    cif = SHIPPED_INPUTS / "ubiquitin_fragment.cif"
    pdb = tmp_path / "fragment.pdb"
    pdb.write_text(gemmi.read_structure(str(cif)).make_pdb_string())
    assert resolve_input_sizes({"inputs": str(pdb)}) == InputSizes("fragment.pdb", 9, 31, 1)
    gz = tmp_path / "fragment.cif.gz"
    gz.write_bytes(__import__("gzip").compress(cif.read_bytes()))
    assert resolve_input_sizes({"inputs": str(gz)}) == InputSizes("fragment.cif.gz", 9, 31, 1)


def test_boltz_yaml_counts_copies_msa_modified_residue_and_ccd_ligand(tmp_path):
    (tmp_path / "ubq.a3m").write_text((SHIPPED_INPUTS / "ubiquitin.a3m").read_text())
    spec = tmp_path / "complex.yaml"
    spec.write_text(
        "version: 1\nsequences:\n"
        f"  - protein:\n      id: [A, B]\n      sequence: {UBIQUITIN}\n      msa: ubq.a3m\n"
        "      modifications:\n        - {position: 1, ccd: MSE}\n"
        "  - ligand: {id: C, ccd: GOL}\n"
        "  - rna: {id: D, sequence: ACGU}\n"
    )
    sizes = resolve_input_sizes({"inputs": str(spec), "ccd": CCD})
    # per copy: 75 standard tokens + MSE as 8 atom tokens (9 heavy less leaving OXT), MET's 8 atoms out
    ubq_tokens, ubq_atoms = 75 + 8, 601 - HEAVY_ATOMS["MET"] + 8
    rna_atoms = HEAVY_ATOMS["A"] + HEAVY_ATOMS["C"] + HEAVY_ATOMS["G"] + HEAVY_ATOMS["U"]
    assert sizes == InputSizes("complex.yaml", 2 * ubq_tokens + 6 + 4, 2 * ubq_atoms + 6 + rna_atoms, 8)


def test_fasta_ligands_and_msa_cap(tmp_path):
    fasta = tmp_path / "mix.fasta"
    fasta.write_text(f">A|protein|{SHIPPED_INPUTS / 'ubiquitin.a3m'}\n{UBIQUITIN}\n>L|smiles\nCCO\n>M|ccd\nGOL\n")
    assert resolve_input_sizes({"inputs": str(fasta), "ccd": CCD}) == InputSizes("mix.fasta", 76 + 3 + 6, 601 + 3 + 6, 8)
    assert resolve_input_sizes({"inputs": str(fasta), "ccd": CCD, "max_msa_seqs": 5}).S == 5


def test_dataset_config_composes_and_resolves():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(__file__).parents[2] / "cpbench" / "conf"), version_base=None):
        cfg = compose("config", overrides=["dataset=real", "dataset.inputs=dna_duplex.fasta"])
        assert resolve_input_sizes(cfg.dataset) == InputSizes("dna_duplex.fasta", 24, 492, 1)
        missing = compose("config", overrides=["dataset=real"])
    with pytest.raises(InputError, match=r"^dataset.inputs: required"):
        resolve_input_sizes(missing.dataset)


_HEADER = "version: 1\nsequences:\n"
BAD_INPUTS = [
    # (file name, content, the error names ...)
    ("nope.yaml", None, r"nope.yaml: no such file \(dataset.inputs\)"),
    ("input.txt", "hello", r"input.txt: unknown input type"),
    ("bad.yaml", _HEADER + "  - protein: {id: A, sequence: MKV\n  - dna", r"bad.yaml:\d+: malformed YAML"),
    ("res.yaml", _HEADER + "  - protein: {id: A, sequence: MKBV}", r"res.yaml: sequences\[0\].protein.sequence: unknown protein residue 'B' at position 3"),
    ("msa.yaml", _HEADER + "  - protein: {id: A, sequence: MKV, msa: gone.a3m}", r"msa.yaml: sequences\[0\].protein.msa: no such MSA file .*gone.a3m"),
    ("smi.yaml", _HEADER + "  - protein: {id: A, sequence: MKV}\n  - ligand: {id: B, smiles: 'C1CC(('}", r"smi.yaml: sequences\[1\].ligand.smiles: RDKit cannot parse SMILES"),
    ("ccd.yaml", _HEADER + "  - ligand: {id: B, ccd: SAH}", r"ccd.yaml: sequences\[0\].ligand.ccd: CCD code 'SAH' needs a components dictionary: set dataset.ccd"),
    ("noid.yaml", _HEADER + "  - protein: {sequence: MKV}", r"noid.yaml: sequences\[0\].protein.id"),
    ("kind.yaml", _HEADER + "  - peptide: {id: A, sequence: MKV}", r"kind.yaml: sequences\[0\]: each entry is one of"),
    ("dna.fasta", ">A|dna\nACGU\n", r"dna.fasta:1: unknown dna residue 'U' at position 4"),
    ("hdr.fasta", ">A|protien\nMKV\n", r"hdr.fasta:1: header type 'protien'"),
    ("msa.fasta", ">A|protein|missing.a3m\nMKV\n", r"msa.fasta:1: MSA: no such MSA file .*missing.a3m"),
    ("binary.yaml", b"\x89PNG\r\n\x1a\n\xff\xfe\x00", r"binary.yaml: not a text YAML file"),
    ("short.fasta", ">A|protein|short.a3m\nMKV\n", r"short.a3m:3: A3M record has 2 match states, the query has 3"),
    ("junk.cif", "this is not a structure\n", r"junk.cif: gemmi cannot read the structure"),
]


@pytest.mark.parametrize("name, content, message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_line_naming_file_and_field(tmp_path, name, content, message):
    if isinstance(content, bytes):
        (tmp_path / name).write_bytes(content)
    elif content is not None:
        (tmp_path / name).write_text(content)
    (tmp_path / "short.a3m").write_text(">q\nMKV\n>h\nMK\n")
    with pytest.raises(InputError) as err:
        resolve_input_sizes({"inputs": str(tmp_path / name), "ccd": None})
    text = str(err.value)
    assert "\n" not in text
    assert __import__("re").search(message, text), text


def test_directory_or_missing_ccd_dictionary_is_named(tmp_path):
    (tmp_path / "dir.fasta").mkdir()
    with pytest.raises(InputError, match=r"dir.fasta: no such file"):
        resolve_input_sizes({"inputs": str(tmp_path / "dir.fasta")})
    spec = tmp_path / "gol.yaml"
    spec.write_text(_HEADER + "  - ligand: {id: G, ccd: GOL}\n")
    with pytest.raises(InputError, match=r"missing.cif: dataset.ccd: cannot read the components dictionary"):
        resolve_input_sizes({"inputs": str(spec), "ccd": str(tmp_path / "missing.cif")})


def test_unknown_ccd_code_names_the_code_and_dictionary(tmp_path):
    spec = tmp_path / "hem.yaml"
    spec.write_text(_HEADER + "  - ligand: {id: H, ccd: HEM}\n")
    with pytest.raises(InputError, match=r"hem.yaml: sequences\[0\].ligand.ccd: CCD code 'HEM' is not in .*ccd_sample.cif"):
        resolve_input_sizes({"inputs": str(spec), "ccd": CCD})
