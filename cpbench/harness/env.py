"""Run metadata for ``result.json``: software versions plus the GPU (through NVML) or the CPU.

``env_metadata(device)`` never fails and never initialises CUDA (the job and supervisors must
not touch the GPU): GPU facts come from NVML (``pynvml``, from nvidia-ml-py; optional), and
anything NVML cannot tell is null. Keys added to ``base_env_metadata()`` (date, host, platform,
python, torch, cuda, nccl, git_commit):

    device               "cuda" | "cpu"
    gpu_model            "NVIDIA H200"                  (the first visible GPU)
    gpu_count            GPUs visible to this job (CUDA_VISIBLE_DEVICES honoured)
    gpu_memory_gib       total memory per GPU
    driver               NVIDIA driver version
    sm_clock_mhz         current SM clock per visible GPU
    sm_clock_max_mhz     max SM clock per visible GPU
    app_clock_mhz        applications-clock target per GPU; app_clock_default_mhz its default
    clocks_locked        true when a GPU's clocks are pinned (applications clocks moved from
                         their default, or NVML reports the clocks held by that setting /
                         locked clocks); false when none is; null when NVML cannot say
    gpu_processes        other processes on the visible GPUs: [{"gpu", "pid", "used_gib"}]
    node_shared          true when any other process uses a visible GPU
    ecc_enabled          ECC mode of each visible GPU
    cpu_model, cpu_count the host CPU (always; the whole story on a CPU run)

and, from ``base_env_metadata()``, ``tuning_env``: the environment variables that change which
kernels run or how memory is managed (``TUNING_ENV_PREFIXES``: inductor's settings such as
``TORCHINDUCTOR_COORDINATE_DESCENT_TUNING``, ``PYTORCH_CUDA_ALLOC_CONF``, NCCL's), so that a run
made under a setting outside cpbench's config says so.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any, Mapping

GPU_KEYS = ("gpu_model", "gpu_count", "gpu_memory_gib", "driver", "sm_clock_mhz", "sm_clock_max_mhz",
            "app_clock_mhz", "app_clock_default_mhz", "clocks_locked", "gpu_processes", "node_shared",
            "ecc_enabled")
# NVML clock-event ("throttle") reason 0x2, ApplicationsClocksSetting (alias UserDefinedClocks):
# the clocks are held at user-set values (applications clocks or locked clocks), not by load.
_HELD_CLOCK_REASONS = 0x2


GIT_COMMIT_ENV = "CPBENCH_GIT_COMMIT"
TUNING_ENV_PREFIXES = ("TORCHINDUCTOR_", "TORCH_COMPILE", "TORCHDYNAMO_", "PYTORCH_", "NCCL_", "CUBLAS_",
                       "CUDNN_", "CUDA_LAUNCH_BLOCKING", "TRITON_")


def tuning_env() -> dict[str, str]:
    """The set environment variables named by ``TUNING_ENV_PREFIXES`` (sorted by name)."""
    return {k: os.environ[k] for k in sorted(os.environ) if k.startswith(TUNING_ENV_PREFIXES)}


def git_commit(repo_dir: str | os.PathLike | None = None) -> str | None:
    """The commit of the checkout at ``repo_dir`` (default: the project root, the folder above
    the ``cpbench`` package), ``+dirty`` when its tracked files have changes; None outside git,
    and None when ``repo_dir`` is not the top of its checkout (sources copied into a folder of
    another checkout, such as a GPU snapshot unpacked there: that checkout's commit is not
    theirs). Without ``repo_dir``, an exported ``CPBENCH_GIT_COMMIT`` wins: sources deployed
    without their ``.git`` (``git archive``, a GPU snapshot) say which commit they are."""
    if repo_dir is None and os.environ.get(GIT_COMMIT_ENV):
        return os.environ[GIT_COMMIT_ENV]
    cwd = Path(repo_dir).resolve() if repo_dir else Path(__file__).resolve().parents[2]
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        if Path(top).resolve() != cwd:
            return None
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def base_env_metadata() -> dict[str, Any]:
    """Host and software metadata that needs no GPU query (the GPU part comes from NVML)."""
    import torch

    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": None,
        "git_commit": git_commit(),
        "tuning_env": tuning_env(),
    }
    if torch.cuda.is_available():
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a build without NCCL
            env["nccl"] = None
    return env


def env_metadata(device: str) -> dict[str, Any]:
    """``base_env_metadata()`` plus the device's facts (see the module docstring); never raises."""
    try:
        env = base_env_metadata()
    except Exception as exc:  # noqa: BLE001 - metadata must never fail a benchmark
        env = {"error": f"base metadata: {exc}"}
    resolved = _resolve_device(device)
    env["device"] = resolved
    env.update(cpu_metadata())
    if resolved == "cuda":
        env.update(dict.fromkeys(GPU_KEYS))
        try:
            env.update(nvml_metadata())
        except Exception as exc:  # noqa: BLE001 - an odd driver must not fail a benchmark
            env["nvml_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return env


def _resolve_device(device: str) -> str:
    """``cuda``/``cpu`` from a config value; ``auto`` asks NVML (not CUDA) whether a GPU exists."""
    device = str(device or "auto").split(":")[0]
    if device != "auto":
        return device
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return "cuda" if pynvml.nvmlDeviceGetCount() > 0 else "cpu"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML, no GPU
        return "cpu"


def cpu_metadata() -> dict[str, Any]:
    """CPU model (from /proc/cpuinfo, else platform) and the cores this process may use."""
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu_model": model or platform.processor() or None, "cpu_count": usable_cpu_count()}


def usable_cpu_count() -> int:
    """Cores this process may run on: its CPU affinity (a cgroup cpuset, ``taskset``, a pinned test
    worker), and inside a SLURM job no more than this task's share of the job's CPUs on this node
    (clusters without task binding, ``TaskPlugin=task/none``, leave every task the whole node's
    affinity). Not the host's count, which oversubscribes a shared node."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity API here (macOS, Windows)
        cores = os.cpu_count() or 1
    share = slurm_task_cpus(os.environ)
    return max(1, min(cores, share)) if share else cores


def slurm_task_cpus(env: Mapping[str, str]) -> int | None:
    """CPUs SLURM allocated to this task on this node (None outside a job): ``SLURM_CPUS_PER_TASK``
    when the job asked for it, else the job's CPUs on this node (``SLURM_CPUS_ON_NODE``) over its
    tasks here (``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE``, e.g. ``2(x3),1``, at
    ``SLURM_NODEID``)."""
    if "SLURM_JOB_ID" not in env:
        return None
    try:
        if env.get("SLURM_CPUS_PER_TASK"):
            return max(1, int(env["SLURM_CPUS_PER_TASK"]))
        if not env.get("SLURM_CPUS_ON_NODE"):
            return None
        tasks = 1
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        if spec:
            per_node = []
            for entry in spec.split(","):
                count, _, repeat = entry.partition("(x")
                per_node += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
            tasks = per_node[min(int(env.get("SLURM_NODEID", "0")), len(per_node) - 1)]
        return max(1, int(env["SLURM_CPUS_ON_NODE"]) // max(1, tasks))
    except ValueError:  # a format this does not know: no SLURM limit rather than a wrong one
        return None


def _visible_indices(count: int, uuids: list[str | None]) -> list[int]:
    """NVML indices of the GPUs CUDA_VISIBLE_DEVICES exposes (all when it is unset)."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    out = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if item.isdigit():
            if int(item) < count:
                out.append(int(item))
        else:
            out += [i for i, u in enumerate(uuids) if u and u.startswith(item)]
    return out


def _call(fn, *args, default=None):
    """One NVML query; None (or ``default``) where the GPU or driver does not support it."""
    try:
        value = fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends
        return default
    return value.decode() if isinstance(value, bytes) else value


def _own_pids() -> set[int]:
    """This process, its children and its parent chain: the benchmark's own GPU users."""
    pids = {os.getpid(), os.getppid()}
    try:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid == os.getpid():
                    pids.add(int(entry))
    except (OSError, ValueError, IndexError):
        pass
    return pids


def nvml_metadata() -> dict[str, Any]:
    """GPU facts through NVML; {} when ``pynvml`` is absent or NVML does not start."""
    try:
        import pynvml
    except ImportError:
        return {}
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_call(pynvml.nvmlDeviceGetUUID, h) for h in handles]
        visible = _visible_indices(count, uuids)
        sm = getattr(pynvml, "NVML_CLOCK_SM", 1)
        info: dict[str, Any] = {"gpu_count": len(visible), "driver": _call(pynvml.nvmlSystemGetDriverVersion)}
        per_gpu: dict[str, list] = {k: [] for k in ("sm_clock_mhz", "sm_clock_max_mhz", "app_clock_mhz",
                                                   "app_clock_default_mhz", "ecc_enabled", "locked")}
        processes, own = [], _own_pids()
        for i in visible:
            h = handles[i]
            if "gpu_model" not in info:
                info["gpu_model"] = _call(pynvml.nvmlDeviceGetName, h)
                mem = _call(pynvml.nvmlDeviceGetMemoryInfo, h)
                info["gpu_memory_gib"] = round(mem.total / 2**30, 2) if mem is not None else None
            per_gpu["sm_clock_mhz"].append(_call(pynvml.nvmlDeviceGetClockInfo, h, sm))
            per_gpu["sm_clock_max_mhz"].append(_call(pynvml.nvmlDeviceGetMaxClockInfo, h, sm))
            app = _call(pynvml.nvmlDeviceGetApplicationsClock, h, sm)
            app_default = _call(pynvml.nvmlDeviceGetDefaultApplicationsClock, h, sm)
            per_gpu["app_clock_mhz"].append(app)
            per_gpu["app_clock_default_mhz"].append(app_default)
            reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            reasons = _call(reasons_fn, h) if reasons_fn else None
            locked = None
            if app is not None and app_default is not None:
                locked = app != app_default
            if reasons is not None:
                locked = bool(locked) or bool(int(reasons) & _HELD_CLOCK_REASONS)
            per_gpu["locked"].append(locked)
            ecc = _call(pynvml.nvmlDeviceGetEccMode, h)
            per_gpu["ecc_enabled"].append(bool(ecc[0]) if isinstance(ecc, (tuple, list)) else None)
            for fn_name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                fn = getattr(pynvml, fn_name, None)
                for proc in (_call(fn, h, default=[]) if fn else []) or []:
                    if proc.pid not in own:
                        used = getattr(proc, "usedGpuMemory", None)
                        processes.append({"gpu": i, "pid": proc.pid,
                                          "used_gib": round(used / 2**30, 3) if isinstance(used, int) else None})
        locked_flags = per_gpu.pop("locked")
        info.update(per_gpu)
        info["clocks_locked"] = True if any(locked_flags) else \
            (None if not locked_flags or None in locked_flags else False)
        info["gpu_processes"] = list({(p["gpu"], p["pid"]): p for p in processes}.values())
        info["node_shared"] = bool(info["gpu_processes"])
        return info
    finally:
        _call(pynvml.nvmlShutdown)
