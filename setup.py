"""ament_python build: `colcon build` (with or without --symlink-install) on a ROS 2 install,
or `pip install .` anywhere."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "vla_edge_ros"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/models/sim", glob("models/sim/*")),  # the trained default checkpoint
    ],
    install_requires=["setuptools"],
    zip_safe=False,
    maintainer="vla_edge_ros maintainers",
    maintainer_email="maintainers@vla-edge-ros.dev",
    description="Vision-Language-Action transformer for ROS 2 under a hard control deadline.",
    license="Apache-2.0",
    python_requires=">=3.10",
    entry_points={"console_scripts": [
        "vla-edge = vla_edge_ros.cli:main",
        "bringup = vla_edge_ros.nodes.bringup:main",
        "synthetic_camera = vla_edge_ros.nodes.synthetic_camera:main",
    ]},
)
