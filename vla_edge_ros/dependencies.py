"""Every third-party module the package imports, and what installs it: pip (setup.py) and rosdep (package.xml).

This table is the one place for it. setup.py reads this file without importing the package (at build time
the package's dependencies may not be installed yet) and builds ``install_requires`` and the extras from it;
package.xml lists the rosdep keys, which test/test_dependencies.py holds equal to the table, together with
every import of the code, the launch file, setup.py, the tests and bench/. An optional feature whose modules
are missing says which to install through ``missing``.

rosdep keys are rosdistro's own where it has one (``rosdep/python.yaml``); a key ending in ``-pip`` is
installed by rosdep with pip. The keys rosdistro lacks are defined in this repository's
``rosdep/vla_edge_ros.yaml``, which a robot adds as a rosdep source (docs/robot.md).
"""

from __future__ import annotations

import re

PACKAGE = "vla_edge_ros"
TORCH = "torch==2.13.0"  # the CPU build on this project's machines; a GPU build works the same

RUNTIME = {  # import: (pip requirement, rosdep key); setup.py's install_requires, package.xml's exec_depends
    "numpy": ("numpy>=1.26,<3", "python3-numpy"),
    "yaml": ("pyyaml>=6.0", "python3-yaml"),
    "cv2": ("opencv-python-headless>=4.8", "python3-opencv"),
    # Qwen2-VL preprocessing resizes with Pillow, as transformers does (Image.Resampling: 9.1)
    "PIL": ("pillow>=9.1", "python3-pil"),
    "cryptography": ("cryptography>=41", "python3-cryptography"),  # the KV store's AES-256-GCM
    # the kernels (the numpy backend imports them too); the CUDA target itself is the cuda extra's numba-cuda
    "numba": ("numba>=0.60", "python3-numba"),
    "llvmlite": ("llvmlite>=0.43", "python3-llvmlite"),  # numba's own: cpu_kernels write AVX-512 loops in its IR
    "threadpoolctl": ("threadpoolctl>=3.1", "python3-threadpoolctl-pip"),  # caps BLAS threads (blas_threads)
    "matplotlib": ("matplotlib>=3.7", "python3-matplotlib"),  # replay and evaluate plots
    "tqdm": ("tqdm>=4.60", "python3-tqdm"),  # progress bars of train, replay, evaluate, memory-bench
    "rosbags": ("rosbags>=0.11", "python3-rosbags-pip"),  # bags: make-bag, replay, play
    # reasoning.instruction: the checkpoint's tokenizer.json, as transformers reads it
    "tokenizers": ("tokenizers>=0.15", "python3-tokenizers-pip"),
    # its chat template, rendered in jinja2's sandbox (3.1.6: the sandbox escapes fixed)
    "jinja2": ("jinja2>=3.1.6", "python3-jinja2"),
}

ROS = {  # ROS 2 package (its import and its rosdep key): its pip wheel of Kilted, the ros extra
    "rclpy": "ros-rclpy==9.1.2",
    "builtin_interfaces": "ros-builtin-interfaces==2.3.0",
    "sensor_msgs": "ros-sensor-msgs==5.5.1",
    "std_msgs": "ros-std-msgs==5.5.1",
    "std_srvs": "ros-std-srvs==5.5.1",
    "geometry_msgs": "ros-geometry-msgs==5.5.1",
    "nav_msgs": "ros-nav-msgs==5.5.1",  # nav_msgs/Odometry: the robot's state (camera_subscriber.state_type)
    "trajectory_msgs": "ros-trajectory-msgs==5.5.1",
    "rosgraph_msgs": "ros-rosgraph-msgs==2.3.0",
    "diagnostic_msgs": "ros-diagnostic-msgs==5.5.1",
    "rcl_interfaces": "ros-rcl-interfaces==2.3.0",
    "lifecycle_msgs": "ros-lifecycle-msgs==2.3.0",
    "ament_index_python": "ros-ament-index-python==1.11.0",
    "launch": None,  # launch and launch_ros have no wheel on the package index (the index's `launch` is another
    "launch_ros": None,  # project): a ROS install has them; without one see docs/robot.md
}
ROS_MIDDLEWARE = ["ros-rmw-fastrtps-cpp==9.3.3"]  # imported by no one: rclpy's DDS, in the ros extra

BUILD = {"setuptools": ("setuptools", "python3-setuptools")}  # setup.py's: install_requires, a buildtool_depend

OPTIONAL = {  # extra: {import: pip requirement}. No rosdep key: a robot's rosdep install leaves them out
    "cuda": {"numba_cuda": "numba-cuda>=0.20"},  # backend cuda: Numba's CUDA target, as NVIDIA maintains it
    "train": {"torch": TORCH},  # vla-edge train
    "parity": {"torch": TORCH, "transformers": "transformers>=4.45"},  # vla-edge parity: the reference forward pass
    "ray": {"ray": "ray>=2.9"},  # --ray: replay, evaluate and memory-bench units as Ray tasks on a cluster
    # worlds/metaworld: Meta-World's Sawyer-arm tasks on MuJoCo (models and experts in the wheel; its internals
    # that seed the layouts are 3.1.1's), drawn headless by PyOpenGL's OSMesa: apt-get install libosmesa6
    "metaworld": {"metaworld": "metaworld==3.1.1", "mujoco": "mujoco>=3.3", "OpenGL": "PyOpenGL>=3.1"},
}

TEST = {  # the test extra, besides cuda and parity: the suite's and bench/'s imports ...
    "pytest": "pytest>=8",
    "safetensors": "safetensors>=0.4",  # test_safetensors: our checkpoint reader against HF's own writer
    "packaging": "packaging",  # test_dependencies: requirements compared as setuptools writes them
    "ctranslate2": "ctranslate2>=4",  # bench_weights: the CPU inference engine our narrow weights are held to
}
TEST_TOOLS = [  # ... and what no file imports
    "nvidia-nvvm==13.0.88; platform_system == 'Linux'",  # numba-cuda compiles every kernel to sm_90/sm_87 PTX
    "nvidia-cuda-nvrtc==13.0.88; platform_system == 'Linux'",
    "osrf-pycommon",  # launch's dependency, for the launch tests (the launch wheels install with --no-deps)
    "pytest-xdist>=3",  # make test spreads the suite over every core (-n auto)
]
DOCS = ["mkdocs>=1.6,<2"]  # make docs


def install_requires() -> list[str]:
    return [requirement for requirement, _ in (*BUILD.values(), *RUNTIME.values())]


def extras_require() -> dict[str, list[str]]:
    test = [*OPTIONAL["cuda"].values(), *OPTIONAL["parity"].values(), *TEST.values(), *TEST_TOOLS]
    return {
        "ros": [wheel for wheel in ROS.values() if wheel] + ROS_MIDDLEWARE,
        **{extra: sorted(set(modules.values())) for extra, modules in OPTIONAL.items()},
        "test": sorted(set(test)),
        "docs": DOCS,
    }


def distribution(requirement: str) -> str:
    """The distribution a pip requirement names: ``numba-cuda>=0.20`` -> ``numba-cuda``."""
    return re.split(r"[<>=!~;\[ ]", requirement)[0]


def missing(extra: str, what: str) -> ValueError:
    """The one-line error for ``what`` (a command, an option, a backend) when the modules of ``extra`` are not
    installed: what it needs, the pip command, and the extra's name."""
    requirements = sorted(set(OPTIONAL[extra].values()))
    names = " and ".join(distribution(requirement) for requirement in requirements)
    quoted = " ".join(f"'{requirement}'" for requirement in requirements)
    return ValueError(f"{what} needs {names}: pip install {quoted} (the '{extra}' extra of {PACKAGE})")
