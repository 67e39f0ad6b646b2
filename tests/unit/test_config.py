"""Config validation: auto values, mesh and padding unit, and one-line errors before any job."""

from __future__ import annotations

import pytest

from cpbench.config import ConfigError, _probe_settings, auto_cuda_graphs, check_group_choices, resolve_point, weak_n

from helpers.run import compose_cfg, fault_model, run_cpbench


def test_cpu_auto_values_follow_the_config_comments():
    point = resolve_point(compose_cfg("device=cpu", "model=tiny"))
    assert point.cp == 2 and point.device == "cpu"
    assert point.probe.start == 128 and point.probe.granularity == 128
    assert point.memory_limit_gib == (0.125 if point.dtype == "bf16" else 0.0625)  # dtype=auto: this CPU's
    fp32 = resolve_point(compose_cfg("device=cpu", "model=tiny", "dtype=fp32"))
    bf16 = resolve_point(compose_cfg("device=cpu", "model=tiny", "dtype=bf16"))
    assert (fp32.memory_limit_gib, bf16.memory_limit_gib) == (0.0625, 0.125)  # oneDNN's bf16 kernels hold more
    assert point.probe.depth == 2  # inference: 2 blocks (run_blocks also shortens the adapter's sampler)
    assert point.N is None and point.N_atoms is None  # N null: the probe alone
    assert resolve_point(compose_cfg("device=cpu", "model=tiny", "N=64")).N_atoms == 8 * 64


def test_inference_depth_is_two_blocks_and_training_depth_is_all():
    assert resolve_point(compose_cfg("device=cpu", "model=boltz2")).probe.depth == 2
    assert resolve_point(compose_cfg("device=cpu", "model=boltz2", "workflow=training")).probe.depth is None


def test_gpu_auto_probe_values_follow_the_config_comments():
    """The default GPU job's probe (cpbench/conf/config.yaml, config.AUTO_*): predict from 1,024 (training
    512), bracket 512 wide, one block per inference step, re-run ends."""
    base = {"start": "auto", "granularity": "auto", "growth": 2, "timeout_s": 900, "depth": "auto", "max_points": 32}
    inference = _probe_settings(base, "cuda", 1, train=False, model={})
    assert (inference.start, inference.granularity, inference.depth) == (1024, 512, 1)
    assert inference.strategy == "predict" and inference.verify is True
    training = _probe_settings(base, "cuda", 1, train=True, model={})
    assert (training.start, training.granularity, training.depth) == (512, 512, None)
    # an adapter's probe_depth (cpbench/models/api.py) is its auto depth on every device
    stock = {"_target_": "cpbench.models.stock.boltz2.Boltz2Adapter"}
    assert _probe_settings(base, "cuda", 1, train=False, model=stock).depth == 2
    assert _probe_settings(base, "cpu", 1, train=False, model=stock).depth == 2


def test_2d_mesh_is_most_square_and_granularity_is_a_multiple_of_the_padding_unit():
    point = resolve_point(compose_cfg("device=cpu", "model=tiny", "topology=2d", "cp=8", "probe.granularity=10"))
    assert point.mesh_shape == (2, 4) and point.mesh_dim_names == ("cp0", "cp1")
    assert point.padding_unit == 4 and point.probe.granularity == 12 and point.probe.start % 4 == 0
    point = resolve_point(compose_cfg("device=cpu", "model=tiny", "topology=2d", "cp=6", "topology.cp0=3"))
    assert point.mesh_shape == (3, 2) and point.padding_unit == 6


def test_1d_padding_unit_is_cp():
    point = resolve_point(compose_cfg("device=cpu", "model=tiny", "cp=3", "probe.start=10"))
    assert point.padding_unit == 3 and point.probe.start == 12
    point = resolve_point(compose_cfg("device=cpu", "model=tiny", "cp=3", "probe.start=12", "probe.depth_check_n=4"))
    assert point.probe.depth_check_n == 6  # rounded up to the padding unit like every probe N


@pytest.mark.parametrize("routine, kernels, device, graphs", [
    ("timing", "auto", "cuda", True),    # timing points on the fast path
    ("timing", "flex", "cuda", True),
    ("probe", "auto", "cuda", False),    # not in probe points
    ("timing", "torch", "cuda", False),  # not on the reference path
    ("timing", "auto", "cpu", False),    # graphs are CUDA's
])
def test_cuda_graphs_auto(routine, kernels, device, graphs):
    assert auto_cuda_graphs(routine, kernels, device) is graphs


@pytest.mark.parametrize("overrides, graphs", [
    (("routine=timing", "N=64"), False),                   # auto on a CPU
    (("routine=probe", "model.cuda_graphs=true"), True),   # explicit values stay
    (("routine=timing", "N=64", "model.cuda_graphs=false"), False),
])
def test_cuda_graphs_reaches_the_adapter_as_a_bool(overrides, graphs):
    """``model.cuda_graphs`` defaults to auto (cpbench/conf/model/pairformer.yaml), resolved per point."""
    point = resolve_point(compose_cfg("device=cpu", "model=boltz2", *overrides))
    assert point.model["cuda_graphs"] is graphs


@pytest.mark.parametrize("overrides, key", [
    (("topology=2d", "cp=4", "topology.cp0=3"), "topology.cp0"),
    (("cp=4", "N=3"), "N"),
    (("timing.warmup=2",), "timing.warmup"),
    (("timing.repeats=4",), "timing.repeats"),
    (("routine=walltime",), "routine"),
    (("dtype=fp16",), "dtype"),
    (("probe.growth=1",), "probe.growth"),
    (("probe.start=64", "probe.depth_check_n=128"), "probe.depth_check_n"),
    (("probe.depth_check_n=0",), "probe.depth_check_n"),
    (("memory.limit_gib=-1",), "memory.limit_gib"),
    (("model=adapter",), "model._target_"),
    (("model=adapter", "model._target_=no_such_pkg.Adapter"), "model._target_"),
    (("model.cuda_graphs=yes",), "model.cuda_graphs"),
    (("model.compile_training=1",), "model.compile_training"),
    (("model.passes=cutlass",), "model.passes"),
    (("model.attention=flash",), "model.attention"),
])
def test_invalid_value_names_its_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        resolve_point(compose_cfg("device=cpu", "model=tiny", *overrides))
    assert err.value.key == key
    assert "\n" not in str(err.value)


def test_unknown_group_option_lists_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"^workflow=serving: one of inference, training$"):
        check_group_choices(["workflow=inference,serving"])


def test_weak_scaling_n_is_a_multiple_of_128():
    assert weak_n(2048, 1) == 2048 and weak_n(2048, 4) == 4096 and weak_n(2048, 2) % 128 == 0
    assert resolve_point(compose_cfg("device=cpu", "model=tiny", "sweep=weak", "cp=4")).N == 4096


@pytest.mark.parametrize("args, key", [
    (["-m", "N=1,32", "cp=2"], "N=1"),
    (["-m", "cp=2,3", "topology=2d", "topology.cp0=2", "N=64"], "topology.cp0=2"),  # cp=3 is the bad point
    (["-m", "workflow=inference,serving"], "workflow=serving"),
    (["timing.warmup=1"], "timing.warmup=1"),
])
def test_cli_config_error_is_one_line_exit_2_and_no_job_starts(tmp_path, args, key):
    proc = run_cpbench([*args, "device=cpu", *fault_model("none"), f"hydra.sweep.dir={tmp_path}/sweep",
                        f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, timeout_s=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"cpbench: error: {key}"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not list(tmp_path.rglob("result.json"))


def _user_conf(root):
    """A user's config dir with one model option of its own (a nested one too)."""
    (root / "model" / "lab").mkdir(parents=True)
    for path in (root / "model" / "mine.yaml", root / "model" / "lab" / "big.yaml"):
        path.write_text("name: mine\n_target_: tests.helpers.faults.FaultAdapter\n")
    return root


@pytest.mark.parametrize("flags", [
    lambda d: ["--config-dir", str(d)],
    lambda d: ["-cd", str(d)],
    lambda d: [f"--config-dir={d}"],
    lambda d: [f"hydra.searchpath=[file://{d}]"],
    lambda d: [f"hydra.searchpath=['file://{d}','pkg://hydra.conf']"],
], ids=["config-dir", "cd", "config-dir=", "searchpath", "searchpath-quoted"])
def test_group_options_in_the_users_config_dirs_pass_the_check(tmp_path, flags):
    args = flags(_user_conf(tmp_path / "mine"))
    check_group_choices([*args, "model=mine", "-m", "model=lab/big,tiny", "workflow=training"])
    with pytest.raises(ConfigError, match=r"^model=nope: one of .*lab/big, mine, .*tiny"):
        check_group_choices([*args, "model=nope"])
    with pytest.raises(ConfigError, match=r"^model=mine: one of "):
        check_group_choices(["model=mine"])  # not without the user's dir


def test_a_pkg_search_path_is_listed_like_a_directory(tmp_path, monkeypatch):
    package = tmp_path / "userpkg"
    _user_conf(package / "conf")
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_group_choices(["hydra.searchpath=[pkg://userpkg/conf]", "model=mine"])
    with pytest.raises(ConfigError, match=r"^model=nope:"):
        check_group_choices(["hydra.searchpath=[pkg://userpkg.conf]", "model=nope"])


def test_search_paths_that_cannot_be_listed_here_leave_the_check_to_hydra():
    check_group_choices(["--config-path", "/elsewhere", "model=theirs"])  # another primary dir
    check_group_choices(["hydra.searchpath=[pkg://no_such_package/conf]", "model=theirs"])
    check_group_choices(["hydra.searchpath=[structured://x]", "model=theirs"])
