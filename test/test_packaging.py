"""The package stays buildable as a ROS 2 ament_python package and safe to run from a checkout."""

from __future__ import annotations

import configparser
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_package_xml_is_format_3_ament_python_with_runtime_depends():
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.get("format") == "3" and root.findtext("name") == "vla_edge_ros"
    assert root.find("export/build_type").text == "ament_python"
    depends = {e.text for e in root.findall("exec_depend")}
    assert {"rclpy", "sensor_msgs", "std_msgs", "geometry_msgs", "trajectory_msgs", "diagnostic_msgs",
            "python3-numpy", "python3-yaml"} <= depends


def test_ament_index_marker_and_script_dirs():
    assert (ROOT / "resource" / "vla_edge_ros").is_file()
    setup_cfg = configparser.ConfigParser()
    setup_cfg.read(ROOT / "setup.cfg")
    assert setup_cfg["develop"]["script_dir"] == "$base/lib/vla_edge_ros"
    assert setup_cfg["install"]["install_scripts"] == "$base/lib/vla_edge_ros"


def declared_by_setup():
    """setup.py's distribution as setuptools reads it (packages, data_files), nothing built."""
    import os
    from distutils.core import run_setup

    from setuptools import distutils  # noqa: F401  (setuptools' bundled distutils, as on Python 3.12+)

    here = os.getcwd()
    os.chdir(ROOT)
    try:
        return run_setup("setup.py", stop_after="init")
    finally:
        os.chdir(here)


def test_setup_installs_every_subpackage():
    """A sub-package missing from setup.py works from a checkout and breaks a colcon install."""
    import os

    declared = set(declared_by_setup().packages)
    on_disk = {".".join(Path(folder).relative_to(ROOT).parts)
               for folder, _, files in os.walk(ROOT / "vla_edge_ros") if "__init__.py" in files}
    assert {"vla_edge_ros.memory", "vla_edge_ros.kv_store", "vla_edge_ros.kernels"} <= on_disk
    assert declared == on_disk


def test_kernels_are_a_plain_subpackage():
    import vla_edge_ros.kernels as kernels

    assert Path(kernels.__file__).resolve().parent == ROOT / "vla_edge_ros" / "kernels"
    assert not any(p.is_symlink() for p in (ROOT / "vla_edge_ros").rglob("*"))
    assert kernels.KERNEL_VERSION


def test_gpu_check_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu_check.sh")]).returncode == 0


def test_launch_file_starts_an_executable_the_package_installs():
    """launch_ros is not installable here, so check statically what the launch file refers to."""
    import ast

    source = (ROOT / "launch" / "vla_edge.launch.py").read_text()
    tree = ast.parse(source)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)
    executables = {kw.value.value for n in ast.walk(tree) if isinstance(n, ast.Call)
                   for kw in n.keywords if kw.arg == "executable"}
    setup = (ROOT / "setup.py").read_text()
    assert executables and all(f'"{exe} = vla_edge_ros.' in setup for exe in executables)
    assert '"config", "default.yaml"' in source and (ROOT / "config" / "default.yaml").is_file()
    arguments = {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", "") == "DeclareLaunchArgument"}
    assert arguments == {"config", "namespace", "image_topic", "use_sim_time", "start_state"}
    assert 'glob("launch/*.launch.py")' in setup


def test_sources_parse_as_python_3_10_for_humble():
    """Humble runs Python 3.10: no syntax newer than that anywhere the package or its tests load."""
    import ast

    sources = [p for folder in ("vla_edge_ros", "launch", "test", "bench")
               for p in (ROOT / folder).rglob("*.py")]
    assert len(sources) > 40
    for path in sources:
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))


def test_the_documented_layout_names_every_package_of_the_tree():
    """docs/development.md's layout block lists vla_edge_ros's packages as they are on disk, no more and no fewer."""
    page = (ROOT / "docs" / "development.md").read_text()
    block = page.split("## Package layout", 1)[1].split("```", 2)[1]
    listed = {line.split()[0].rstrip("/") for line in block.splitlines()
              if line.startswith("  ") and not line.startswith("   ") and line.split()[0].endswith("/")}
    on_disk = {p.name for p in (ROOT / "vla_edge_ros").iterdir() if (p / "__init__.py").is_file()}
    assert listed == on_disk


@pytest.mark.parametrize("model, recipes", [("sim", ("recipe.yaml",)), ("metaworld", ("recipe.yaml", "state-only.yaml")),
                                            ("metaworld-memory", ("recipe.yaml",))])
def test_setup_installs_exactly_the_shipped_model_files(model, recipes):
    """Each shipped model (models/sim, models/metaworld, models/metaworld-memory) ships its checkpoint, tokenizer and
    chat template, recipes and one summary log, nothing else (no plots, no old logs, no evaluation phrasings, no
    demonstrations); at most 20 MB."""
    shipped = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
               "train_log.json", *recipes)
    data_files = dict(declared_by_setup().data_files)
    assert sorted(data_files[f"share/vla_edge_ros/models/{model}"]) == sorted(f"models/{model}/{n}" for n in shipped)
    assert all((ROOT / "models" / model / name).is_file() for name in shipped)
    assert sum((ROOT / "models" / model / name).stat().st_size for name in shipped) <= 20 * 2**20
