"""``model=foldcp/boltz2``'s refusals, each one line before any job starts: Fold-CP missing (or the
stock ``boltz`` in its place), a cp that is not a perfect square, topology=1d beyond cp=1, a
non-square grid, a kernel backend this machine cannot run. The first test runs anywhere; the
others need Fold-CP (``bash scripts/install_foldcp.sh``: its own venv, ``docs/peers.md``).
"""

from __future__ import annotations

import re
import sys

import pytest

from cpbench.config import ConfigError, check_group_choices, resolve_point
from cpbench.models.foldcp import is_foldcp_installed, package

from helpers.run import compose_cfg

pytestmark = pytest.mark.foldcp
needs_foldcp = pytest.mark.skipif(not is_foldcp_installed(),
                                  reason="Fold-CP is not installed: bash scripts/install_foldcp.sh (docs/peers.md)")


def _refusal(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        resolve_point(compose_cfg("model=foldcp/boltz2", "device=cpu", *overrides))
    assert "\n" not in str(err.value)
    return err.value


def test_without_foldcp_the_model_is_one_line_naming_the_install_script(monkeypatch):
    monkeypatch.setitem(sys.modules, package.CP_PACKAGE, None)   # "not installed" (a stock boltz may be)
    monkeypatch.setitem(sys.modules, package.TRUNK_MODULE, None)
    err = _refusal("cp=1")
    assert err.key == "model" and str(err).startswith("model=foldcp/boltz2: ")
    assert "bash scripts/install_foldcp.sh" in str(err)


def test_the_nested_option_is_known_to_the_group_check():
    check_group_choices(["model=foldcp/boltz2,stock/boltz2"])


@needs_foldcp
@pytest.mark.parametrize("cp", [2, 3, 8])
def test_cp_must_be_a_perfect_square(cp):
    err = _refusal("topology=2d", f"cp={cp}")
    assert err.key == "cp" and "a perfect square (1, 4, 9, 16, ...)" in err.allowed


@needs_foldcp
def test_topology_1d_runs_cp1_only_and_says_why():
    err = _refusal("topology=1d", "cp=4")
    assert err.key == "topology" and err.allowed.startswith("2d for model=foldcp/boltz2 at cp > 1")
    assert package.TRUNK_1D_MODULE in err.allowed or "does not run yet" in err.allowed
    point = resolve_point(compose_cfg("model=foldcp/boltz2", "device=cpu", "topology=1d", "cp=1"))
    assert point.cp == 1


@needs_foldcp
def test_a_non_square_grid_is_refused():
    err = _refusal("topology=2d", "cp=4", "topology.cp0=1")
    assert err.key == "topology.cp0" and "null or 2" in err.allowed


@needs_foldcp
@pytest.mark.parametrize("key, value, says", [
    ("tri_attn_backend", "cueq", "needs a CUDA device"),
    ("tri_attn_backend", "trifast", "needs a CUDA device"),
    ("tri_attn_backend", "flash", "one of auto, reference, trifast, cueq"),
    ("pair_bias_backend", "torch_flex_attn", "needs a CUDA device"),
    ("weight_init", "zeros", "one of boltz, uniform"),
])
def test_backends_and_init_are_checked_before_any_job(key, value, says):
    err = _refusal("topology=2d", "cp=4", f"model.{key}={value}")
    assert err.key == f"model.{key}" and says in err.allowed


@needs_foldcp
def test_a_cuda_backend_without_its_package_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuequivariance_ops_torch", None)
    assert "cuequivariance_ops_torch package, which is not installed" in package.tri_attn_refusal("cueq", "cuda")
    assert package.resolve_tri_attn("auto", "cuda") == "reference"
    assert package.resolve_tri_attn("auto", "cpu") == "reference" and package.resolve_pair_bias("auto", "cpu") == "reference"


@needs_foldcp
def test_the_record_names_the_fold_cp_commit_the_script_installed():
    assert re.fullmatch(r"boltz 2\.2\.1 \(Fold-CP [0-9a-f]{7}\)", package.version_label()), package.version_label()


@needs_foldcp
def test_stock_boltz2_refuses_fold_cps_boltz_in_one_line():
    """Fold-CP installs as boltz 2.2.1 too: the stock adapter must not run its serial copy as "stock"."""
    with pytest.raises(ConfigError) as err:
        resolve_point(compose_cfg("model=stock/boltz2", "device=cpu", "cp=1"))
    assert err.value.key == "model" and "not the stock Boltz-2 package" in str(err.value)
    assert "bash scripts/install_stock.sh boltz2" in str(err.value) and "\n" not in str(err.value)
