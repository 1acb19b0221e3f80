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
    assert {"ros", "cuda", "train", "parity", "ray", "metaworld", "test", "docs"} == set(extras)
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
    path.write_text("camera_subscriber:\n  ros__parameters:\n    state_topic: odom\n    state_type: odometry\n"
                    "reasoning:\n  ros__parameters:\n    backend: cuda\n")  # the shipped model reads odometry
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


def test_the_robot_page_shows_every_key_rosdep_installs_with_pip_and_every_extra_as_the_table_has_them():
    page = (ROOT / "docs" / "robot.md").read_text()
    install = page.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    assert "file://$HOME/ros2_ws/src/vla_edge_ros/rosdep/vla_edge_ros.yaml" in install
    assert "PIP_BREAK_SYSTEM_PACKAGES=1 rosdep install --from-paths src --ignore-src -y" in install
    for _, key in deps.RUNTIME.values():
        assert not key.endswith("-pip") or f"`{key}`" in install, f"docs/robot.md does not say {key} is pip's"
    rows = {cells[1].strip(" `"): cells[-2].strip() for cells in
            (line.split("|") for line in install.splitlines() if line.startswith("| `"))}
    assert rows == {extra: "`" + " ".join(f"'{r}'" for r in sorted(set(modules.values()))) + "`"
                    for extra, modules in deps.OPTIONAL.items()}
    readme = (ROOT / "README.md").read_text()
    assert all(line in readme for line in install.splitlines() if line.startswith(("echo", "cd ~/ros2_ws &&")))


def documented_blocks() -> list[str]:
    """The two bash blocks of docs/robot.md's "Without a ROS install": the pip install, the prefix and launch."""
    section = (ROOT / "docs" / "robot.md").read_text().split("### Without a ROS install\n", 1)[1]
    return [block.split("\n", 1)[1] for block in section.split("```")[1:4:2]]


@pytest.mark.slow
def test_a_fresh_environment_with_the_documented_pip_install_runs_replay_evaluate_and_the_launch(tmp_path):
    """docs/robot.md's install without ROS, run as written in a copy of this checkout (its own .venv, from the
    package index or pip's cache, nothing else): then make-bag, replay, evaluate, and the launch from the
    documented prefix, up and commanding, stopped by SIGINT with exit code 0. No optional extra is installed."""
    import os
    import shutil
    import signal
    import time

    wheels = ROOT.parent / "shared" / "wheels" / "ros2-launch"
    if not wheels.is_dir():
        pytest.skip(f"{wheels} is missing: the launch wheels are not on the package index")
    checkout = tmp_path / "work" / "vla_edge_ros"
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(".venv", ".git", "build", "install", "*.egg-info",
                                                                   "__pycache__", "site", "models"))
    shutil.copytree(ROOT / "models" / "sim", checkout / "models" / "sim")
    (tmp_path / "work" / "shared").symlink_to(ROOT.parent / "shared")
    install, launch = documented_blocks()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "NUMBA_"))}

    def bash(script: str, timeout: float) -> str:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=checkout, env=env, text=True,
                              capture_output=True, timeout=timeout)
        assert done.returncode == 0, f"{script}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    started = time.monotonic()
    bash(install, timeout=1500)
    installed_s = time.monotonic() - started
    optional = sorted({m for modules in deps.OPTIONAL.values() for m in modules})
    present = bash(f".venv/bin/python -c \"import importlib.util as u; print([m for m in {optional!r} "
                   "if u.find_spec(m)])\"", timeout=60)
    assert present.strip() == "[]"
    bash(".venv/bin/vla-edge make-bag --scenario cue-recall --out cue.mcap --seconds 2 && "
         ".venv/bin/vla-edge replay cue.mcap --policy fifo,cosine --cost fixed:encode=8ms,decode=1ms --out r && "
         ".venv/bin/vla-edge evaluate --policy fifo --budgets 4 --episodes 1 --time-limit-s 2 "
         "--cost fixed:encode=8ms,decode=1ms --out e && test -f r/report.md && test -f e/evaluate.json", timeout=900)
    config = tmp_path / "robot.yaml"
    config.write_text("reasoning:\n  ros__parameters:\n    deadline_ms: 1000.0\n")
    *build, command = launch.strip().splitlines()  # the prefix and its environment; then the launch, as bash's exec
    script = "\n".join([*build, "exec " + command.replace("/path/to/robot.yaml", str(config))])
    process = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=checkout,
                               env={**env, "ROS_DOMAIN_ID": str(100 + os.getpid() % 100)}, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines: list[str] = []
    try:
        for line in process.stdout:
            lines.append(line)
            if "active: commanding" in line:  # the last node up; a signal before the spin is a start-up's, exit 2
                time.sleep(2.0)
                os.killpg(process.pid, signal.SIGINT)
                break
        process.wait(timeout=120)
    finally:
        process.kill()
    out = "".join(lines) + process.stdout.read()
    assert any("active: commanding" in line for line in lines) and process.returncode == 0, out[-3000:]
    assert "deactivated: sent an explicit stop" in out
    print(f"install {installed_s:.0f} s, all {time.monotonic() - started:.0f} s")
