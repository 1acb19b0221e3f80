"""ament_python build: `colcon build` (with or without --symlink-install) on a ROS 2 install,
or `pip install .[ros]` anywhere (ROS 2 Kilted from pip wheels).

The dependencies, install_requires and every extra, come from vla_edge_ros/dependencies.py, the one table of
what the code imports, its pip requirement and its rosdep key (colcon installs none of them: rosdep reads
package.xml). It is read here as a file: importing the package would need its dependencies installed first.
`make setup` installs every extra.
"""

import runpy
from glob import glob
from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = "vla_edge_ros"
DEPENDENCIES = runpy.run_path(str(Path(__file__).resolve().parent / PACKAGE / "dependencies.py"))

# the trained checkpoints and the recipe files that made them: the 2-D world's default and Meta-World's MT10 arm
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                    "train_log.json")
SHIPPED_MODELS = {"sim": ("recipe.yaml",), "metaworld": ("recipe.yaml", "state-only.yaml"),
                  "metaworld-memory": ("recipe.yaml",)}

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/config", glob("config/*.yaml") + glob("config/*.xml")),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        *((f"share/{PACKAGE}/models/{model}", [f"models/{model}/{name}" for name in CHECKPOINT_FILES + recipes])
          for model, recipes in SHIPPED_MODELS.items()),
    ],
    install_requires=DEPENDENCIES["install_requires"](),
    extras_require=DEPENDENCIES["extras_require"](),
    zip_safe=False,
    maintainer="vla_edge_ros maintainers",
    maintainer_email="maintainers@vla-edge-ros.dev",
    description="Vision-Language-Action transformer for ROS 2 under a hard control deadline.",
    license="Apache-2.0",
    python_requires=">=3.10",
    entry_points={"console_scripts": [
        "vla-edge = vla_edge_ros.cli:main",
        "bringup = vla_edge_ros.nodes.entry:bringup",
        "synthetic_camera = vla_edge_ros.nodes.entry:synthetic_camera",
    ]},
)
