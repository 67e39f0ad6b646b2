"""Config validation and derived values: one resolved ``Point`` per sweep point.

Everything a user can get wrong is checked here, before any job starts, and reported as one
line ``cpbench: error: <key>=<value>: <what is allowed>`` (``ConfigError``). Auto values
(``cp``, ``device``, ``probe.start``, ``probe.granularity``, ``probe.depth``, ``probe.strategy``,
``probe.verify``, ``memory.limit_gib``) are resolved here, and so are the mesh shape and the padding unit:

* topology 1d: mesh ``("cp",)`` of shape ``(cp,)``; every sharded axis is padded to ``cp``.
* topology 2d: mesh ``("cp0", "cp1")`` of shape ``(cp0, cp1)``, ``cp0`` the most square
  divisor of ``cp`` unless ``topology.cp0`` says otherwise; padding unit ``lcm(cp0, cp1)``.

Probe N values are multiples of the padding unit, and the bisection granularity is rounded
up to one. The CUDA queries live in ``harness/devices.py``, the CPU swap to the tiny preset in
``job.py``; the ``cpbench_weak_n`` resolver is registered by whoever resolves a config.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cpbench.data.real import resolve_input_sizes
from cpbench.harness.devices import cuda_available, local_gpu_count
from cpbench.link import LinkError, link_from_config
from cpbench.models import dtypes
from cpbench.models.api import (
    AdapterConfigError,
    AdapterError,
    adapter_int_attr,
    adapter_max_cp,
    check_adapter_config,
    import_target,
)
from cpbench.models.pairformer.flops import PAIRFORMER_TARGET
from cpbench.models.pairformer.ops import kernels

CONF_DIR = Path(__file__).resolve().parent / "conf"  # the config tree ships inside the package
# Config groups whose option is a file under <config dir>/<group>/ (the package's conf/ or the
# user's: check_group_choices); checked before Hydra composes so that an unknown option is one
# line, not Hydra's multi-line composition error.
CHECKED_GROUPS = ("workflow", "topology", "dataset", "model", "sweep", "link", "headline", "experiment")
WORKFLOWS = ("inference", "training")
TOPOLOGIES = ("1d", "2d")
ROUTINES = ("auto", "probe", "timing")
DEVICES = ("auto", "cuda", "cpu")
BREAKDOWN_SITES = ("function", "op")  # memory.breakdown_sites (cpbench.harness.breakdown)
# Keys that do not change a measurement, left out of the resume signature.
UNSIGNED_KEYS = ("resume", "report", "hydra")

# Auto values, per device kind (cpbench/conf/config.yaml comments say the same).
# GPU: sized for a default job (`python -m cpbench`) that answers on one H200 in about ten
# minutes (564 s on a warm machine: docs/perf_notes.md, "The harness and its verdicts"): a predict probe
# from 1,024 (three lean points, 30-45 s each, most of it compiling), a bracket one
# granularity wide around the prediction (512: the near-limit point with sampling takes 2-5
# minutes, so a finer default would cost a point each halving), its two ends re-run (verify),
# one block per probe step (the depth check verifies it against the full step). The exact
# figure: probe.granularity=128 (the result's bracket says how wide it is). Training starts at
# 512 (its block-input checkpoints are ~68 pair tensors: N=1,024 needs ~17 GiB). On a CPU,
# inference starts at 128: the points below it are mostly process starts.
AUTO_PROBE_START = {"cuda": {"inference": 1024, "training": 512}, "cpu": {"inference": 128, "training": 32}}
# CPU: the tiny trunk is memory-lean (~0.06 GiB above baseline at N=512 in fp32, cp=2), so a
# cap this small is what lets the default CPU probe meet a real allocation failure within a
# minute or two on 2 cores. 128: under a cap this small the failure point moves by some 64
# tokens (about 10 MiB) between runs of one configuration, so a 64-token bracket was often not
# reproduced by the verification re-runs (status unstable); 128 also saves the near-limit point,
# the costliest of the search (the quick start, fp32, 2 cores, 2026-12-04: 640 and 704 fit in 21
# and 27 s, 768 out of memory).
AUTO_GRANULARITY = {"cuda": 512, "cpu": 128}
# The CPU cap per workflow (probe only: a CPU timing point runs uncapped). Inference 0.0625
# GiB: the quick start (cp=2, fp32 on a CPU without bf16 units, 2 cores) then fits N=512 and
# runs out of memory at 576 in about two minutes (a Xeon, 64-token bisection; an AMD EPYC at
# 128, 2026-12-04: 640, out of memory at 768, in 102-105 s); under 0.125 GiB its search took ~200 s there
# (max N 1,088). Training: 0.19 GiB at N=32, 0.24 at N=64, 0.36 at N=128 (oneDNN's
# workspaces and the optimizer state), so a smaller cap made every training probe fail at its
# first point. Inference in bf16 (a CPU with bf16 units: AVX512-BF16, AMX) keeps 0.125 GiB:
# oneDNN's bf16 kernels hold more, and under 0.0625 GiB the tiny trunk's first point (N=32,
# cp=2, peak 0.07 GiB) ended in a segmentation fault inside oneDNN, not an allocation error;
# under 0.125 GiB the quick start ends at max N 384 (first failing 448) on such a CPU.
AUTO_LIMIT_GIB = {"cuda": None, "cpu": {"inference": {"fp32": 0.0625, "bf16": 0.125}, "training": 0.3}}
AUTO_CP_ON_CPU = 2
# Blocks per inference probe step: on a GPU one (a near-limit block at N~16,700 takes ~40 s
# and more with sampling: the MSA module and the sampler run min(depth, ...) blocks and steps
# too); on a CPU two, as the quick start's timings in the README were measured.
AUTO_INFERENCE_DEPTH = {"cuda": 1, "cpu": 2}
PROBE_STRATEGIES = ("auto", "bisect", "predict")
AUTO_PROBE_STRATEGY = {"cuda": "predict", "cpu": "bisect"}
AUTO_PROBE_VERIFY = {"cuda": True, "cpu": True}
# emulate.comm_reserve_gib=auto: device memory the real run's communicator holds and the fake
# group never allocates, per device (its backend). NCCL: its channel buffers grow with the peers
# and the collectives used; on 8 H100s of one node an all-to-all took NCCL's own device memory
# from 1.06 GB to 4.34 GB (NVIDIA/nccl issue 1685, excluding PyTorch's), and one communicator
# with an all-reduce about 1.6 GB (NVIDIA/nccl issue 864). The trunk uses all-to-all (1d) or
# p2p plus sub-group all-gathers (2d, a communicator per mesh axis): 4.5 GiB covers the largest
# published figure. gloo's buffers are host memory the CPU cap counts, small beside a step
# (on a CPU the emulated peak lies in the band of the real ranks' resident-set peaks, which move
# by 5-10 % from run to run at the tests' sizes: tests/distributed/test_emulation.py).
AUTO_COMM_RESERVE_GIB = {"cuda": (4.5, "auto: NCCL's published footprint (nccl issues 1685, 864)"),
                         "cpu": (0.0, "auto: gloo (host buffers, counted by the CPU cap)")}
MIN_WARMUP = 3
MIN_REPEATS = 5

# The reference trunk's switches and what each allows once resolved (cuda_graphs=auto is resolved
# by resolve_point first; a typo such as model.cuda_graphs=yes would otherwise read as true).
PAIRFORMER_FLAGS = {"compile_training": "true or false", "cuda_graphs": "true or false or auto",
                    "checkpoint_ops": "true or false"}


class ConfigError(ValueError):
    """A user-caused config mistake: ``key=value: what is allowed`` (one line)."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value}: {allowed}")


class InputFileError(ConfigError):
    """A real input file (``dataset.inputs``) that cannot be read or tokenised. In a multirun it
    is that point's ``error`` row and the other inputs still run (a sweep over inputs should
    not die of one bad file); alone it is a one-line error like any config mistake."""


@dataclass(frozen=True)
class ProbeSettings:
    start: int              # first N (a multiple of the padding unit)
    growth: float           # ramp factor
    granularity: int        # bisection stops when the gap is at most this (multiple of the unit)
    timeout_s: float        # per probe point
    depth: int | None       # blocks per probe step (run_blocks); None = all blocks
    max_points: int
    budget_s: float | None = None  # no new probe point starts after this many seconds of the probe
    depth_check_n: int | None = None  # N of the depth check; None = the first point (start)
    strategy: str = "bisect"  # "bisect" (ramp, then bisect) | "predict" (fit cheap points, bisect a bracket)
    verify: bool = False      # re-run max_n and the first failing N after the search
    floor: int | None = None  # an N expected to fit: measured before bisecting down from a failure above it


@dataclass(frozen=True)
class TimingSettings:
    warmup: int
    repeats: int
    timeout_s: float


@dataclass(frozen=True)
class Point:
    """One sweep point with every auto value resolved (what a job runs)."""

    workflow: str
    train: bool
    topology: str
    cp: int
    mesh_shape: tuple[int, ...]
    mesh_dim_names: tuple[str, ...]
    padding_unit: int
    N: int | None           # None: no timing size (a probe; it ramps from probe.start)
    N_atoms: int | None     # None with N
    atoms_per_token: int
    S: int
    dtype: str              # "bf16" | "fp32", resolved (dtype=auto: resolve_dtype)
    device: str             # "cuda" | "cpu"
    routine: str
    seed: int
    profile: bool
    memory_limit_gib: float | None
    cuda_alloc_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF for the workers (runner.py)
    model: dict = field(default_factory=dict)
    probe: ProbeSettings | None = None
    timing: TimingSettings | None = None
    input: str | None = None  # real inputs: the input file's name
    dtype_reason: str = ""    # why this dtype (dtype=auto on a CPU: the bf16 evidence)
    emulate: bool = False     # rank 0 of cp ranks alone over the fake process group (harness/emulation.py)
    comm_reserve_gib: float = 0.0  # emulate: device memory held back for the communicator the fake group lacks
    comm_reserve_source: str = ""  # where that figure comes from
    link: dict = field(default_factory=dict)  # the link config node, validated (cpbench.link)
    memory_breakdown: bool = False  # timing: one more step under the profiler (cpbench.harness.breakdown)
    breakdown_sites: str = "function"  # the breakdown's sites: by function (Python stacks) or by op

    @property
    def ranks_launched(self) -> int:
        """Worker processes per point: ``cp``, or one under emulation."""
        return 1 if self.emulate else self.cp

    def record(self) -> dict:
        """The ``point`` block of ``result.json`` and ``probe_state.json`` (``cpbench/results/record.py``):
        the resolved fields plus the per-rank memory cap and the PYTORCH_CUDA_ALLOC_CONF its
        workers ran with."""
        return {"workflow": self.workflow, "topology": self.topology, "cp": self.cp,
                "mesh_shape": list(self.mesh_shape), "N": self.N, "N_atoms": self.N_atoms,
                "S": self.S, "dtype": self.dtype, "dtype_reason": self.dtype_reason, "device": self.device, "input": self.input,
                "model": dict(self.model), "memory_limit_gib": self.memory_limit_gib,
                "cuda_alloc_conf": self.worker_alloc_conf(), "emulated": self.emulate,
                **({"emulation": {"K": self.cp, "grid": list(self.mesh_shape), "comm_reserve_gib": self.comm_reserve_gib,
                                  "comm_reserve_source": self.comm_reserve_source}} if self.emulate else {})}

    def worker_alloc_conf(self) -> str | None:
        """The workers' PYTORCH_CUDA_ALLOC_CONF: an exported one is the user's choice and wins,
        else ``memory.cuda_alloc_conf`` (None: unset)."""
        return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", self.cuda_alloc_conf)

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- resolvers

def weak_n(base: Any, cp: Any) -> int:
    """N for weak scaling (N²/cp fixed): ``base·√cp`` rounded to a multiple of 128."""
    return max(128, int(round(float(base) * math.sqrt(int(cp)) / 128.0)) * 128)


def register_resolvers() -> None:
    """Register ``${cpbench_weak_n:base,cp}`` (cpbench/conf/sweep/weak.yaml); idempotent."""
    if not OmegaConf.has_resolver("cpbench_weak_n"):
        OmegaConf.register_new_resolver("cpbench_weak_n", weak_n)



# ---------------------------------------------------------------- checks

def _int(key: str, value: Any, minimum: int | None = None, allowed: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise TypeError
        except TypeError:
            raise ConfigError(key, value, allowed or "an integer") from None
    if minimum is not None and value < minimum:
        raise ConfigError(key, value, allowed or f"an integer >= {minimum}")
    return int(value)


def _positive_float(key: str, value: Any, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(key, value, allowed)
    return float(value)


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(key, value, f"one of {', '.join(choices)}")
    return str(value)


def _is_auto(value: Any) -> bool:
    return value is None or value == "auto"


def round_up(n: int, unit: int) -> int:
    return -(-int(n) // unit) * unit


def most_square_cp0(cp: int) -> int:
    """The largest divisor of ``cp`` that is at most √cp (2x2 for 4, 2x4 for 8)."""
    return max(d for d in range(1, math.isqrt(cp) + 1) if cp % d == 0)


def mesh_for(topology: str, cp: int, cp0: Any) -> tuple[tuple[int, ...], tuple[str, ...], int]:
    """(mesh shape, mesh dim names, padding unit) of a topology at ``cp`` ranks."""
    if topology == "1d":
        return (cp,), ("cp",), cp
    if cp0 is None:
        cp0 = most_square_cp0(cp)
    cp0 = _int("topology.cp0", cp0, 1, f"a divisor of cp={cp} (or null for the most square grid)")
    if cp % cp0:
        raise ConfigError("topology.cp0", cp0, f"a divisor of cp={cp} (or null for the most square grid)")
    cp1 = cp // cp0
    return (cp0, cp1), ("cp0", "cp1"), math.lcm(cp0, cp1)


def check_group_choices(argv: list[str]) -> None:
    """Check ``group=option[,option...]`` overrides against the options Hydra can find: the
    files under ``<dir>/<group>/`` of the package's conf/ and of the user's config dirs
    (``config_dirs``: ``-cd DIR``, ``hydra.searchpath=[file://DIR]``).

    Hydra itself rejects an unknown option only with a multi-line composition error; this
    gives the one-line error before Hydra runs. Sweep syntax other than a plain comma list
    (``choice(...)``, globs) is left to Hydra, and so is every option where the config dirs
    cannot be listed here (``config_dirs`` returns None).
    """
    dirs = config_dirs(argv)
    if dirs is None:
        return
    for arg in argv:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if not sep or key not in CHECKED_GROUPS or "(" in value or "*" in value:
            continue
        options = sorted({option for d in dirs for option in group_options(d, key)})
        for option in value.split(","):
            if option and option != "null" and option not in options:
                raise ConfigError(key, option, f"one of {', '.join(options)}")


def config_dirs(argv: list[str]) -> list[Any] | None:
    """The config dirs Hydra composes from for this command line: the package's conf/, then
    ``-cd DIR`` / ``--config-dir DIR`` and the entries of ``hydra.searchpath=[...]``
    (``file://DIR``, relative to the working directory as Hydra reads it, or ``pkg://package/dir``).
    Each is a ``Path`` or an ``importlib.resources`` traversable. None when one cannot be listed
    here (``--config-path``/``-cp`` replaces the primary dir; an unknown scheme; a package that
    does not import): then Hydra alone judges the group options."""
    dirs: list[Any] = [CONF_DIR]
    args = iter(argv)
    for arg in args:
        flag, eq, value = arg.partition("=")
        if flag in ("-cd", "--config-dir"):
            dirs.append(Path(os.path.abspath(value if eq else next(args, ""))))
        elif flag in ("-cp", "--config-path"):
            return None
        elif flag.lstrip("+~") == "hydra.searchpath" and eq:
            entries = _searchpath(arg)
            if entries is None:
                return None
            for entry in entries:
                found = _search_dir(entry)
                if found is None:
                    return None
                dirs.append(found)
    return dirs


def _searchpath(arg: str) -> list[str] | None:
    """The entries of a ``hydra.searchpath=[...]`` override, parsed as Hydra parses it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        value = OverridesParser.create().parse_override(arg).value()
    except Exception:  # noqa: BLE001 - a malformed override: Hydra's own error says what is wrong
        return None
    return [str(v) for v in value] if isinstance(value, list) else None


def _search_dir(entry: str) -> Any | None:
    """A search path entry as a directory to list: ``file://DIR`` or ``pkg://package/dir``."""
    scheme, sep, path = entry.partition("://")
    if sep and scheme == "file":
        return Path(path)
    if sep and scheme == "pkg":
        from importlib import resources

        try:
            return resources.files(path.replace("/", ".").rstrip("."))  # Hydra's own reading of pkg://
        except (ImportError, TypeError, ValueError):
            return None
    return None


def group_options(config_dir: Any, group: str) -> list[str]:
    """The options of ``group`` in one config dir: its ``<group>/**/*.yaml`` files, nested ones
    as ``sub/name`` (``model=stock/boltz2`` is ``model/stock/boltz2.yaml``)."""
    found: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(".yaml"):
                found.append(prefix + child.name[: -len(".yaml")])

    base = config_dir.joinpath(group)
    if base.is_dir():
        walk(base, "")
    return found


def signature_config(cfg: DictConfig | dict) -> dict:
    """The resolved config minus the keys that do not change a measurement (resume identity)."""
    register_resolvers()
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    return {k: v for k, v in data.items() if k not in UNSIGNED_KEYS}


# ---------------------------------------------------------------- resolution

def resolve_routine(routine: str, n: int | None) -> str:
    """``routine=auto``: a timing at N when the resolved config has one (whoever set it: the
    command line, a sweep or experiment file, a real input; the job also makes sure the
    configuration's max-N probe exists: ``cpbench.job``), else the max-N probe. It depends on
    the resolved config only, never on how an override was spelt."""
    if routine != "auto":
        return routine
    return "timing" if n is not None else "probe"


def resolve_point(cfg: DictConfig) -> Point:
    """Validate ``cfg`` and resolve every auto value; raises ``ConfigError`` (one line)."""
    register_resolvers()
    try:
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except Exception as exc:  # noqa: BLE001 - an interpolation the user broke
        raise ConfigError("config", "?", f"cannot resolve: {str(exc).splitlines()[0]}") from None
    data = {k: v for k, v in data.items() if k != "hydra"}

    workflow = data.get("workflow") or {}
    topology = data.get("topology") or {}
    _choice("workflow", workflow.get("name"), WORKFLOWS)
    _choice("topology", topology.get("name"), TOPOLOGIES)
    routine_asked = _choice("routine", data.get("routine"), ROUTINES)
    dtype_asked = _choice("dtype", data.get("dtype"), dtypes.DTYPES)
    device = _choice("device", data.get("device"), DEVICES)
    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    dtype, dtype_reason = resolve_dtype(dtype_asked, device)

    cp = data.get("cp")
    if _is_auto(cp):
        cp = max(1, local_gpu_count()) if device == "cuda" else AUTO_CP_ON_CPU
        cp = min(cp, adapter_max_cp(data.get("model") or {}) or cp)  # a single-GPU adapter: 1
    cp = _int("cp", cp, 1, "a positive integer or auto")
    mesh_shape, dim_names, unit = mesh_for(topology["name"], cp, topology.get("cp0"))

    atoms_per_token = _int("atoms_per_token", data.get("atoms_per_token"), 1, "a positive integer")
    s = _int("S", data.get("S"), 1, "a positive integer (MSA depth)")
    input_name = None
    dataset = data.get("dataset") or {}
    if dataset.get("name") == "real":  # the input's sizes, whatever N says
        input_name, n, n_atoms, s = _real_input_sizes(dataset)
    else:
        n, n_atoms = _sizes(data.get("N"), data.get("N_atoms"), atoms_per_token)
    routine = resolve_routine(routine_asked, n)
    if routine == "timing" and n is None:
        raise ConfigError("N", "null", "a positive integer (tokens) for routine=timing; "
                          "without N, routine=probe or auto finds the max N")
    if n is not None and n < cp:
        raise ConfigError("N", n, f"at least cp={cp} (every rank needs one token)")

    model = data.get("model") or {}
    if isinstance(model, dict) and model.get("dtype") == "auto":  # the presets say dtype: ${dtype}
        model["dtype"] = dtype
    if not isinstance(model, dict) or model.get("_target_") in (None, "???", ""):
        raise ConfigError("model._target_", model.get("_target_") if isinstance(model, dict) else model,
                          "a class or module with build_model, build_batch, run_step (model=adapter model._target_=pkg.Cls)")
    _check_importable(str(model["_target_"]))
    _check_adapter_config(model, cp, device, bool(workflow.get("train")))
    if model.get("_target_") == PAIRFORMER_TARGET:
        if model.get("kernels") is not None:
            _check_kernels(str(model["kernels"]), device)
        if model.get("cuda_graphs") == "auto":
            model["cuda_graphs"] = auto_cuda_graphs(routine, str(model.get("kernels", "auto")), device)
        passes = model.get("passes", "inductor")
        if passes not in kernels.PASSES:
            raise ConfigError("model.passes", passes, " or ".join(kernels.PASSES))
        if passes == "triton" and device == "cuda" and importlib.util.find_spec("triton") is None:
            raise ConfigError("model.passes", passes, "inductor here: Triton is not installed (pip install triton)")
        attention = model.get("attention", "auto")
        if attention not in kernels.ATTENTION:
            raise ConfigError("model.attention", attention, " or ".join(kernels.ATTENTION))
        if attention == "triton" and device == "cuda" and importlib.util.find_spec("triton") is None:
            raise ConfigError("model.attention", attention, "auto here: Triton is not installed (pip install triton)")
        for flag, allowed in PAIRFORMER_FLAGS.items():
            if flag in model and not isinstance(model[flag], bool):
                raise ConfigError(f"model.{flag}", model[flag], allowed)

    probe_cfg = data.get("probe") or {}
    timing_cfg = data.get("timing") or {}
    probe = _probe_settings(probe_cfg, device, unit, bool(workflow.get("train")), model)
    timing = TimingSettings(
        warmup=_int("timing.warmup", timing_cfg.get("warmup"), MIN_WARMUP, f"an integer >= {MIN_WARMUP}"),
        repeats=_int("timing.repeats", timing_cfg.get("repeats"), MIN_REPEATS, f"an integer >= {MIN_REPEATS}"),
        timeout_s=_positive_float("timing.timeout_s", timing_cfg.get("timeout_s"), "seconds > 0"),
    )
    limit = (data.get("memory") or {}).get("limit_gib")
    if limit == "auto":
        # The CPU cap exists so that a probe meets a real allocation failure; a timing point
        # has nothing to find, and oneDNN's workspaces (training) do not fit the probe's cap.
        limit = auto_limit_gib(device, workflow["name"], dtype) if routine == "probe" else None
    elif limit is not None:
        limit = _positive_float("memory.limit_gib", limit, "auto, null or GiB > 0")

    link = _link(data.get("link"))
    emulate, reserve_gib, reserve_source = _emulation(data.get("emulate"), device, link)

    alloc_conf = (data.get("memory") or {}).get("cuda_alloc_conf")
    if alloc_conf is not None and (not isinstance(alloc_conf, str) or not alloc_conf.strip()):
        raise ConfigError("memory.cuda_alloc_conf", alloc_conf,
                          "null or a PYTORCH_CUDA_ALLOC_CONF string such as expandable_segments:True")

    breakdown = (data.get("memory") or {}).get("breakdown", False)
    if not isinstance(breakdown, bool):
        raise ConfigError("memory.breakdown", breakdown, "true or false")
    sites = _choice("memory.breakdown_sites", (data.get("memory") or {}).get("breakdown_sites", "function"),
                    BREAKDOWN_SITES)

    return Point(
        workflow=workflow["name"], train=bool(workflow.get("train")), topology=topology["name"], cp=cp,
        mesh_shape=mesh_shape, mesh_dim_names=dim_names, padding_unit=unit, N=n, N_atoms=n_atoms,
        atoms_per_token=atoms_per_token, S=s, dtype=dtype, dtype_reason=dtype_reason, device=device, routine=routine,
        seed=_int("seed", data.get("seed")), profile=bool(data.get("profile")),
        memory_limit_gib=limit, cuda_alloc_conf=alloc_conf, model=model, probe=probe, timing=timing, input=input_name,
        emulate=emulate, comm_reserve_gib=reserve_gib, comm_reserve_source=reserve_source, link=link,
        memory_breakdown=breakdown, breakdown_sites=sites,
    )


def _sizes(n: Any, n_atoms: Any, atoms_per_token: int) -> tuple[int | None, int | None]:
    """(N, N_atoms) of a synthetic point: ``N_atoms`` null means ``atoms_per_token·N``. N null
    (no timing size: a probe, which sizes atoms per token at every N it tries) needs N_atoms null."""
    if n is None:
        if n_atoms is not None:
            raise ConfigError("N_atoms", n_atoms, "null while N is null (set N to time these sizes; "
                              "a probe sizes atoms as atoms_per_token*N)")
        return None, None
    n = _int("N", n, 1, "null or a positive integer (tokens)")
    if n_atoms is None:
        return n, atoms_per_token * n
    return n, _int("N_atoms", n_atoms, n, f"null or an integer >= N={n}")


def emulate_enabled(value: Any) -> bool:
    """``emulate``: the node ``{enabled, comm_reserve_gib}``, or a plain bool where a config or the
    compose API replaced the node (``emulate=true``)."""
    return bool(value.get("enabled")) if isinstance(value, dict) else bool(value)


def normalize_overrides(argv: list[str]) -> list[str]:
    """``emulate=V`` on the command line means ``emulate.enabled=V``: the node keeps its
    ``comm_reserve_gib`` (``emulate=true emulate.comm_reserve_gib=2`` works in either order)."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        out.append(f"{key}.enabled={value}" if sep and key.lstrip("+~") == "emulate" and "." not in key else arg)
    return out


def _link(node: Any) -> dict:
    """The ``link`` node, checked by building its model (one line naming the key on a mistake);
    a calibration file's figures are read in (``link=measured link.file=FILE``)."""
    try:
        link_from_config(node or {})
    except LinkError as exc:
        key, _, allowed = str(exc).partition(": ")
        raise ConfigError(key.split("=")[0], key.partition("=")[2], allowed) from None
    node = dict(node or {})
    if node.get("file") not in (None, "???"):
        node["comm_memory_gib"] = model_memory_gib(node["file"])
    return node


def model_memory_gib(path: str) -> float | None:
    """The communicator's device memory a calibration file measured (``comm_memory_gib``)."""
    import json

    value = json.loads(Path(str(path)).expanduser().read_text()).get("comm_memory_gib")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _emulation(value: Any, device: str, link: dict) -> tuple[bool, float, str]:
    """(emulate, the communicator's memory allowance in GiB, where it comes from): on CUDA with
    ``link=measured`` the calibration's measured NCCL memory, else ``AUTO_COMM_RESERVE_GIB``."""
    node = value if isinstance(value, dict) else {"enabled": value, "comm_reserve_gib": "auto"}
    enabled = node.get("enabled")
    if not isinstance(enabled, bool):
        raise ConfigError("emulate", enabled, "true or false")
    if not enabled:
        return False, 0.0, ""
    reserve = node.get("comm_reserve_gib", "auto")
    if reserve == "auto":
        if device == "cuda" and link.get("comm_memory_gib") is not None:
            return True, float(link["comm_memory_gib"]), f"auto: measured by python -m cpbench.link ({link['file']})"
        return True, *AUTO_COMM_RESERVE_GIB[device]
    if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or reserve < 0:
        raise ConfigError("emulate.comm_reserve_gib", reserve, "auto or GiB >= 0")
    return True, float(reserve), "emulate.comm_reserve_gib"


def resolve_dtype(dtype: str, device: str) -> tuple[str, str]:
    """``dtype=auto``: bf16 on CUDA; on a CPU bf16 only where it has native bf16 matrix units,
    else fp32 (``cpbench.models.dtypes``). Returns (dtype, why)."""
    return dtypes.resolve(dtype, device)


def auto_cuda_graphs(routine: str, kernels: str, device: str) -> bool:
    """``model.cuda_graphs=auto``: replay CUDA graphs (where they apply: inference at cp=1 on CUDA,
    ``modules/cuda_graphs.py``) in timing points on the fast path, on CUDA. Not in probe points: a probe
    answers with memory, which graphs do not lower, and its verdicts were measured eager; not
    under ``model.kernels=torch``, the reference path, timed as it always was. On one H200 the
    64-block pass at N=512 took 260 ms with graphs against 520 ms without (sampling at N=512:
    3.9 against 11.8 s), and the same at N=2,048 (``docs/perf_notes.md``, "The 64-block pass: compiled
    passes and CUDA graphs")."""
    return device == "cuda" and routine == "timing" and kernels != "torch"


def auto_limit_gib(device: str, workflow: str, dtype: str) -> float | None:
    """``memory.limit_gib=auto`` of a probe (``AUTO_LIMIT_GIB``): none on a GPU, on a CPU the
    workflow's cap (inference: per dtype)."""
    auto = AUTO_LIMIT_GIB[device]
    if isinstance(auto, dict):
        auto = auto.get(workflow)
    return auto.get(dtype) if isinstance(auto, dict) else auto


def _probe_settings(probe: dict, device: str, unit: int, train: bool, model: dict) -> ProbeSettings:
    start = probe.get("start")
    if start == "auto":
        start = AUTO_PROBE_START[device]["training" if train else "inference"]
    else:
        start = _int("probe.start", start, 1, "auto or a positive integer")
    start = round_up(start, unit)  # every N the probe tries is a multiple of the padding unit
    gran = probe.get("granularity")
    gran = AUTO_GRANULARITY[device] if gran == "auto" else _int("probe.granularity", gran, 1, "auto or a positive integer")
    growth = probe.get("growth")
    if isinstance(growth, bool) or not isinstance(growth, (int, float)) or growth <= 1:
        raise ConfigError("probe.growth", growth, "a number > 1")
    depth = probe.get("depth")
    if depth == "auto":
        depth = None if train else (adapter_int_attr(model, "probe_depth") or AUTO_INFERENCE_DEPTH[device])
    elif depth in (None, "all"):
        depth = None
    else:
        depth = _int("probe.depth", depth, 1, "auto, all or a positive integer (blocks)")
    check_n = probe.get("depth_check_n")
    if check_n is not None:
        check_n = round_up(_int("probe.depth_check_n", check_n, 1, "null or a positive integer (N)"), unit)
        if check_n > start:
            raise ConfigError("probe.depth_check_n", probe.get("depth_check_n"), f"null or an N <= probe.start ({start})")
    floor = probe.get("floor")
    if floor is not None:
        floor = _int("probe.floor", floor, 1, "null or a positive integer (N)") // unit * unit
        if not unit <= floor < start:
            raise ConfigError("probe.floor", probe.get("floor"), f"null or an N below probe.start ({start})")
    return ProbeSettings(
        start=start, growth=float(growth), granularity=round_up(gran, unit),
        timeout_s=_positive_float("probe.timeout_s", probe.get("timeout_s"), "seconds > 0"),
        depth=depth, max_points=_int("probe.max_points", probe.get("max_points"), 2, "an integer >= 2"),
        budget_s=None if probe.get("budget_s") is None
        else _positive_float("probe.budget_s", probe.get("budget_s"), "null or seconds > 0"),
        depth_check_n=check_n, strategy=_probe_strategy(probe.get("strategy", "auto"), device),
        verify=_probe_verify(probe.get("verify", "auto"), device), floor=floor,
    )


def _probe_strategy(value: Any, device: str) -> str:
    """``probe.strategy``: auto -> predict on cuda, bisect on cpu."""
    strategy = _choice("probe.strategy", value, PROBE_STRATEGIES)
    return AUTO_PROBE_STRATEGY[device] if strategy == "auto" else strategy


def _probe_verify(value: Any, device: str) -> bool:
    """``probe.verify``: auto -> true (both devices: a CPU cap's verdict is re-run too); else true or false."""
    if value == "auto":
        return AUTO_PROBE_VERIFY[device]
    if not isinstance(value, bool):
        raise ConfigError("probe.verify", value, "auto, true or false")
    return value


def _check_importable(target: str) -> None:
    """A misspelt adapter fails here, once, rather than in every worker of every point."""
    try:
        import_target(target)
    except AdapterError as exc:
        raise ConfigError("model._target_", target, str(exc).split(": ", 1)[-1]) from None


def _check_adapter_config(model: dict, cp: int, device: str, train: bool) -> None:
    """The adapter's own refusals (``check_config`` of ``cpbench/models/api.py``), as one line."""
    try:
        check_adapter_config(model, cp, device, train)
    except AdapterConfigError as exc:
        raise ConfigError(exc.key, exc.value, exc.allowed) from None


def _check_kernels(name: str, device: str) -> None:
    """The reference trunk's ``model.kernels`` names a backend this device can run (``cueq``
    needs its package); a user's adapter may give ``kernels`` a meaning of its own."""
    import torch

    try:
        kernels.resolve(name, torch.device(device))
    except kernels.KernelError as exc:
        raise ConfigError("model.kernels", name, str(exc).split(": ", 1)[-1]) from None


def _real_input_sizes(dataset: dict) -> tuple[str, int, int, int]:
    """(name, N, N_atoms, S) of a real input, through the data package's reader."""
    try:
        sizes = resolve_input_sizes(dataset)
    except (ValueError, OSError) as exc:
        raise InputFileError("dataset.inputs", dataset.get("inputs"), str(exc).splitlines()[0]) from None
    return sizes.name, int(sizes.N), int(sizes.N_atoms), int(sizes.S)
