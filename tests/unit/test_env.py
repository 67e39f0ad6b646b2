"""env_metadata: software + device facts, NVML read through a fake pynvml, never failing."""

import os
import subprocess
import sys
import types

import pytest

from cpbench.harness import env as env_mod


class _Mem:
    total = 141 * 2**30


class _Proc:
    def __init__(self, pid, used):
        self.pid, self.usedGpuMemory = pid, used


def fake_pynvml(app_clock=1980, default_app_clock=1980, reasons=0x0, procs=((), ()), fail=()):
    """A pynvml stand-in for two H200s; ``procs`` per GPU; names in ``fail`` raise."""
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM = 1

    def query(name, fn):
        def call(*args):
            if name in fail:
                raise RuntimeError(f"NVML {name} not supported")
            return fn(*args)
        setattr(m, name, call)

    query("nvmlInit", lambda: None)
    query("nvmlShutdown", lambda: None)
    query("nvmlDeviceGetCount", lambda: 2)
    query("nvmlDeviceGetHandleByIndex", lambda i: i)
    query("nvmlDeviceGetUUID", lambda h: f"GPU-{h}aaaa")
    query("nvmlSystemGetDriverVersion", lambda: b"580.95")
    query("nvmlDeviceGetName", lambda h: "NVIDIA H200")
    query("nvmlDeviceGetMemoryInfo", lambda h: _Mem())
    query("nvmlDeviceGetClockInfo", lambda h, c: 1755)
    query("nvmlDeviceGetMaxClockInfo", lambda h, c: 1980)
    query("nvmlDeviceGetApplicationsClock", lambda h, c: app_clock)
    query("nvmlDeviceGetDefaultApplicationsClock", lambda h, c: default_app_clock)
    query("nvmlDeviceGetCurrentClocksEventReasons", lambda h: reasons)
    query("nvmlDeviceGetEccMode", lambda h: (1, 1))
    query("nvmlDeviceGetComputeRunningProcesses", lambda h: [_Proc(p, 2**30) for p in procs[h]])
    query("nvmlDeviceGetGraphicsRunningProcesses", lambda h: [])
    return m


@pytest.fixture
def nvml(monkeypatch):
    def install(**kwargs):
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(**kwargs))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


def test_cpu_metadata_has_versions_cpu_model_and_cores():
    env = env_mod.env_metadata("cpu")
    for key in ("date", "host", "torch", "git_commit", "cpu_model", "cpu_count"):
        assert key in env
    assert env["device"] == "cpu" and env["cpu_count"] >= 1 and "gpu_model" not in env


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity API here")
def test_usable_cores_follow_the_cpu_affinity_not_the_host(monkeypatch):
    """A job pinned to one core (a SLURM cpuset, taskset, a pinned test process) sizes its
    workers' intra-op threads from that core, not from every core of the host."""
    code = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); " \
           "from cpbench.harness.env import usable_cpu_count, cpu_metadata; " \
           "print(usable_cpu_count(), cpu_metadata()['cpu_count'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "1"]
    monkeypatch.delattr(os, "sched_getaffinity")
    assert env_mod.usable_cpu_count() == (os.cpu_count() or 1)


@pytest.mark.parametrize("env, cpus", [
    ({}, None),                                                          # not in a SLURM job
    ({"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "8", "SLURM_CPUS_ON_NODE": "64"}, 8),
    ({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "1", "SLURM_TASKS_PER_NODE": "1"}, 1),
    ({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "16", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1"}, 4),
    ({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "6", "SLURM_TASKS_PER_NODE": "4,3", "SLURM_NODEID": "1"}, 2),
    ({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "6", "SLURM_TASKS_PER_NODE": "odd"}, None),
])
def test_a_slurm_task_uses_its_share_of_the_jobs_cpus(env, cpus, monkeypatch):
    """Without task binding (TaskPlugin=task/none) every task sees the whole node; its workers'
    threads must still fit the CPUs SLURM gave it."""
    assert env_mod.slurm_task_cpus(env) == cpus
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    assert env_mod.usable_cpu_count() == (min(affinity, cpus) if cpus else affinity)


def test_tuning_env_records_kernel_settings_only(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", "1")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setenv("CPBENCH_UNRELATED_SETTING", "x")
    tuning = env_mod.env_metadata("cpu")["tuning_env"]
    assert tuning["TORCHINDUCTOR_COORDINATE_DESCENT_TUNING"] == "1"
    assert tuning["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "CPBENCH_UNRELATED_SETTING" not in tuning


def test_cuda_metadata_without_nvml_is_null_not_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as on a CPU machine
    env = env_mod.env_metadata("cuda")
    assert env["device"] == "cuda"
    assert all(env[k] is None for k in env_mod.GPU_KEYS)


def test_nvml_reports_gpu_model_memory_clocks_ecc_and_unshared_node(nvml):
    nvml()
    env = env_mod.env_metadata("cuda")
    assert env["gpu_model"] == "NVIDIA H200" and env["gpu_count"] == 2
    assert env["gpu_memory_gib"] == 141.0 and env["driver"] == "580.95"
    assert env["sm_clock_mhz"] == [1755, 1755] and env["sm_clock_max_mhz"] == [1980, 1980]
    assert env["clocks_locked"] is False and env["ecc_enabled"] == [True, True]
    assert env["node_shared"] is False and env["gpu_processes"] == []


@pytest.mark.parametrize("kwargs", [{"app_clock": 1410}, {"reasons": 0x2}])
def test_nvml_sees_locked_clocks(nvml, kwargs):
    nvml(**kwargs)
    assert env_mod.env_metadata("cuda")["clocks_locked"] is True


def test_another_process_on_a_visible_gpu_marks_the_node_shared(nvml, monkeypatch):
    nvml(procs=((os.getpid(), 4242), (777,)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # GPU 1's process is not ours to count
    env = env_mod.env_metadata("cuda")
    assert env["gpu_count"] == 1 and env["node_shared"] is True
    assert [p["pid"] for p in env["gpu_processes"]] == [4242]


def test_unsupported_nvml_queries_leave_nulls_and_never_raise(nvml):
    nvml(fail={"nvmlDeviceGetApplicationsClock", "nvmlDeviceGetCurrentClocksEventReasons",
               "nvmlDeviceGetEccMode", "nvmlDeviceGetComputeRunningProcesses"})
    env = env_mod.env_metadata("cuda")
    assert env["gpu_model"] == "NVIDIA H200"
    assert env["clocks_locked"] is None and env["ecc_enabled"] == [None, None]


def test_nvml_that_fails_to_start_is_recorded_not_raised(nvml):
    nvml(fail={"nvmlInit"})
    env = env_mod.env_metadata("cuda")
    assert env["gpu_model"] is None and "nvml_error" in env


def test_git_commit_is_the_checkouts_own_and_null_for_sources_copied_into_another(tmp_path, monkeypatch):
    """A checkout's top gives its commit (``+dirty`` after a tracked change); a folder inside
    another checkout (a GPU snapshot unpacked there) gives None, not the outer checkout's commit."""
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "a.txt").write_text("1")
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "b.txt").write_text("2")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert env_mod.git_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("changed")
    assert env_mod.git_commit(tmp_path) == head + "+dirty"
    assert env_mod.git_commit(tmp_path / "copy") is None
    monkeypatch.delenv(env_mod.GIT_COMMIT_ENV, raising=False)
    assert env_mod.git_commit() is not None  # this checkout: the tests run from its top
    monkeypatch.setenv(env_mod.GIT_COMMIT_ENV, "abc1234")  # sources deployed without .git say it
    assert env_mod.git_commit() == "abc1234"
