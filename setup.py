"""ament_python build: `colcon build` (with or without --symlink-install) on a ROS 2 install,
or `pip install .[ros]` anywhere (ROS 2 Kilted from pip wheels).

Dependencies, one place (colcon installs none of them: rosdep reads package.xml):
- install_requires: what the runtime needs (`vla-edge run`, replay, evaluate, the KV store);
- ros: rclpy and the messages as pip wheels, for a machine without a ROS 2 install;
- train: `vla-edge train` (CPU torch);
- ray: `--ray` on replay, evaluate and memory-bench (units as Ray tasks on a cluster);
- test: the suite (transformers for parity, NVVM/NVRTC to compile the kernels to PTX, pytest).
`make setup` installs all of them.
"""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "vla_edge_ros"
TORCH = "torch==2.13.0"  # the CPU build on this project's machines; a GPU build works the same

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/config", glob("config/*.yaml") + glob("config/*.xml")),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/models/sim", [f"models/sim/{name}" for name in (  # the trained default checkpoint
            "config.json", "model.safetensors", "recipe.yaml", "train_log.json")]),
    ],
    install_requires=[
        "setuptools",
        "numpy>=1.26,<3",
        "threadpoolctl>=3.1",  # caps BLAS threads at run time (reasoning.blas_threads)
        "pyyaml>=6.0",
        "safetensors>=0.4",
        "cryptography>=41",
        "opencv-python-headless>=4.8",
        "rosbags>=0.11",
        "matplotlib>=3.7",  # replay and evaluate plots
        "pillow>=9.1",  # Qwen2-VL preprocessing resizes with Pillow, as transformers does (Image.Resampling: 9.1)
        "numba>=0.60",  # the cuda backend's kernels (auto picks numpy without a GPU)
        "numba-cuda>=0.20",
        "tqdm>=4.60",  # progress bars (train, and the units of replay, evaluate, memory-bench)
        "tokenizers>=0.15",  # reasoning.instruction: the checkpoint's tokenizer.json, as transformers reads it
        "jinja2>=3.1.6",  # its chat template, rendered in jinja2's sandbox (3.1.6: the sandbox escapes fixed)
    ],
    extras_require={
        "ros": [  # ROS 2 Kilted from pip wheels
            "ros-rclpy==9.1.2",
            "ros-sensor-msgs==5.5.1",
            "ros-std-msgs==5.5.1",
            "ros-std-srvs==5.5.1",
            "ros-geometry-msgs==5.5.1",
            "ros-trajectory-msgs==5.5.1",
            "ros-rosgraph-msgs==2.3.0",
            "ros-diagnostic-msgs==5.5.1",
            "ros-rcl-interfaces==2.3.0",
            "ros-lifecycle-msgs==2.3.0",
            "ros-rmw-fastrtps-cpp==9.3.3",
        ],
        "train": [TORCH],
        "ray": ["ray>=2.9"],  # --ray: replay, evaluate and memory-bench units as Ray tasks
        "docs": ["mkdocs>=1.6,<2"],
        "test": [
            TORCH,
            "transformers>=4.45",  # the reference our forward pass is proven against
            "nvidia-nvvm==13.0.88; platform_system == 'Linux'",  # compile every kernel to sm_90/sm_87 PTX
            "nvidia-cuda-nvrtc==13.0.88; platform_system == 'Linux'",
            "pytest>=8",
            "osrf-pycommon",  # launch's dependency, for the launch tests (launch itself: ../shared wheels)
        ],
    },
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
