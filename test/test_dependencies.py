"""What the code imports is what pip and rosdep install: vla_edge_ros/dependencies.py is the table, checked here
against every import (lazy ones inside functions too) of the package, the launch file, setup.py, the tests and
bench/, against setup.py, package.xml and our rosdep source; and an optional feature whose modules are missing
ends with one line naming its extra and exit code 2."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from test_architecture import imports_of, modules
from test_packaging import declared_by_setup

from vla_edge_ros import dependencies as deps

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(modules().values()) + sorted((ROOT / "launch").glob("*.py")) + [ROOT / "setup.py"]
DEVELOPMENT = sorted((ROOT / "test").glob("*.py")) + sorted((ROOT / "bench").glob("*.py"))
NAMES = {path: name for name, path in modules().items()}
HELPERS = {path.stem for path in DEVELOPMENT}  # test/'s helper modules, which bench/ imports too


def third_party(paths: Iterable[Path]) -> dict[str, set[str]]:
    """Top-level module -> the files importing it, for every import of ``paths`` from outside the standard
    library, the package and test/ and bench/."""
    found: dict[str, set[str]] = {}
    for path in paths:
        _, outside = imports_of(NAMES.get(path, ""), path, set(modules()))
        for module in outside - set(sys.stdlib_module_names) - HELPERS:
            found.setdefault(module, set()).add(str(path.relative_to(ROOT)))
    return found


def tabled() -> set[str]:
    """Every import the table installs for the shipped code."""
    return {*deps.RUNTIME, *deps.ROS, *deps.BUILD, *(m for extra in deps.OPTIONAL.values() for m in extra)}


def listing(imports: dict[str, set[str]], names: Iterable[str]) -> str:
    return "\n".join(f"  {name}: imported by {', '.join(sorted(imports[name]))}" for name in sorted(names))


def test_every_import_of_the_shipped_code_has_a_pip_requirement_and_a_rosdep_key_or_an_extra():
    imports = third_party(SHIPPED)
    assert {"numpy", "rclpy", "rosbags", "torch", "ray", "setuptools"} <= set(imports)  # the walk sees them all
    unknown = set(imports) - tabled()
    assert not unknown, ("imported, but vla_edge_ros/dependencies.py names no pip requirement and rosdep key "
                         "(RUNTIME, ROS) or extra (OPTIONAL) for them:\n" + listing(imports, unknown))


def test_every_import_of_the_tests_and_benchmarks_is_in_the_test_extra_or_the_shipped_table():
    imports = third_party(DEVELOPMENT)
    unknown = set(imports) - tabled() - set(deps.TEST)
    assert not unknown, "add them to TEST in vla_edge_ros/dependencies.py:\n" + listing(imports, unknown)


def test_the_table_installs_nothing_that_no_file_imports():
    shipped, development = set(third_party(SHIPPED)), set(third_party(DEVELOPMENT))
    assert not tabled() - shipped, f"no shipped file imports {sorted(tabled() - shipped)}"
    assert not set(deps.TEST) - development - shipped, f"no test imports {sorted(set(deps.TEST) - development)}"


def same(requirements: Iterable[str]) -> list[str]:
    """``requirements`` written the one way setuptools writes them."""
    return [str(Requirement(requirement)) for requirement in requirements]


def test_setup_py_installs_what_the_table_says():
    declared = declared_by_setup()
    assert same(declared.install_requires) == same(deps.install_requires())
    assert {extra: same(r) for extra, r in declared.extras_require.items()} == {
        extra: same(r) for extra, r in deps.extras_require().items()}
    assert not any(name.startswith("safetensors") for name in declared.install_requires)  # our own reader
    extras = deps.extras_require()
    assert {"ros", "cuda", "train", "parity", "ray", "test", "docs"} == set(extras)
    assert set(deps.OPTIONAL["cuda"].values()) | set(deps.OPTIONAL["parity"].values()) <= set(extras["test"])


def test_package_xml_depends_on_exactly_the_rosdep_keys_of_the_table():
    """A robot's ``rosdep install`` gives the runtime (run, launch, replay, evaluate) and no optional extra."""
    root = ET.parse(ROOT / "package.xml").getroot()
    depends = {tag: sorted(e.text for e in root.findall(tag)) for tag in ("exec_depend", "buildtool_depend")}
    assert depends["exec_depend"] == sorted({key for _, key in deps.RUNTIME.values()} | set(deps.ROS))
    assert depends["buildtool_depend"] == sorted(key for _, key in deps.BUILD.values())


def test_the_rosdep_keys_rosdistro_lacks_are_defined_in_our_rosdep_source_and_install_the_same_requirement():
    source = yaml.safe_load((ROOT / "rosdep" / "vla_edge_ros.yaml").read_text())
    ours = {key: deps.distribution(requirement) for requirement, key in deps.RUNTIME.values() if key in source}
    assert set(ours) == set(source) and {"python3-threadpoolctl-pip", "python3-tokenizers-pip"} <= set(ours)
    for key, name in ours.items():
        assert key == f"python3-{name}-pip"  # rosdep's name for a key it installs with pip
        assert {os: rule["pip"]["packages"] for os, rule in source[key].items()} == {"debian": [name], "ubuntu": [name]}


def missing_extra(hidden: list[str], argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """``vla-edge argv`` in a process where ``hidden`` cannot be imported (numba-cuda's import redirector
    gone with it, as on a machine without it)."""
    shim = (f"import sys; sys.modules.update(dict.fromkeys({hidden!r})); "
            "sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != 'NumbaCudaFinder']; "
            f"from vla_edge_ros.cli import main; sys.exit(main({argv!r}))")
    return subprocess.run([sys.executable, "-c", shim], cwd=tmp_path, capture_output=True, text=True, timeout=300)


def cuda_config(tmp_path: Path) -> str:
    path = tmp_path / "cuda.yaml"
    path.write_text("reasoning:\n  ros__parameters:\n    backend: cuda\n")
    return str(path)


@pytest.mark.parametrize("extra, what, hidden, argv", [
    ("train", "training", ["torch"], lambda tmp: ["train", "--recipe", str(ROOT / "models/sim/recipe.yaml"),
                                                  "--out", str(tmp / "out")]),
    ("parity", "the reference forward pass", ["transformers"],
     lambda tmp: ["parity", "--model", str(ROOT / "models/sim"), "--token-ids", "1,2"]),
    ("parity", "the reference forward pass", ["torch"],
     lambda tmp: ["parity", "--model", str(ROOT / "models/sim"), "--token-ids", "1,2"]),
    ("cuda", "backend 'cuda'", ["numba_cuda"], lambda tmp: ["engine", "--config", cuda_config(tmp), "--frames", "1"]),
    ("ray", "--ray", ["ray"], lambda tmp: ["evaluate", "--ray", "127.0.0.1:9", "--episodes", "1", "--policy", "fifo",
                                          "--budgets", "4", "--time-limit-s", "2", "--out", str(tmp / "eval")]),
], ids=["train-torch", "parity-transformers", "parity-torch", "cuda-numba-cuda", "ray"])
def test_an_optional_feature_without_its_extra_is_one_line_naming_the_extra_and_exit_2(extra, what, hidden, argv,
                                                                                     tmp_path):
    args = argv(tmp_path)
    done = missing_extra(hidden, args, tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"vla-edge {args[0]}: error: ")  # the cuda line also names the config key
    assert done.stderr.endswith(f"{deps.missing(extra, what)}\n") and f"the '{extra}' extra" in done.stderr


def test_the_missing_extra_line_names_every_requirement_quoted_for_a_shell():
    assert str(deps.missing("parity", "parity")) == (
        f"parity needs torch and transformers: pip install '{deps.TORCH}' "
        f"'{deps.OPTIONAL['parity']['transformers']}' (the 'parity' extra of vla_edge_ros)")

