"""The import graph, drawn from the code: no cycles, no layer importing one above it, ROS only in nodes/.

Every ``import`` and ``from ... import`` anywhere in a module counts, inside functions too: a lazy import
is still a dependency. The layers, lowest first (docs/ARCHITECTURE.md explains each):
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vla_edge_ros"
LAYERS = (
    ("config", "numerics", "worlds"),  # the schema; NumPy math and bf16; synthetic worlds (pure NumPy)
    ("kernels",),  # Numba-CUDA kernels and their NumPy twins
    ("model",),  # checkpoint, config, arena, backends, vision, action head, memory plan
    ("memory",),  # KV memory policies, seeing a MemoryContext
    ("engine",),  # the VLA engine: model + one policy over one arena
    ("kv_store",),  # encrypted, model-bound KV blocks
    ("runtime",),  # frame buffer, admission gate, reasoner, action output, clocks, driver, loader
    ("bags",),  # reading and writing rosbags (rosbags, not rclpy)
    ("tools", "train"),  # replay, evaluate, memory bench, parity; training
    ("nodes",),  # the ROS 2 layer
    ("cli",),  # the command line
    ("__main__",),  # python -m vla_edge_ros
)
ROS_MODULES = {"rclpy", "launch", "launch_ros", "ament_index_python", "builtin_interfaces", "diagnostic_msgs",
               "geometry_msgs", "rcl_interfaces", "rosgraph_msgs", "sensor_msgs", "std_msgs", "std_srvs",
               "trajectory_msgs"}


def modules() -> dict[str, Path]:
    """Dotted name (without the package) -> file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(package modules, top-level outside modules) that ``name`` imports."""
    is_package = path.name == "__init__.py"
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = (["vla_edge_ros"] + (name.split(".") if name else []))
                base = base if is_package else base[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from P import m`` of a submodule m depends on m (P, its parent, is imported first anyway);
            # of a name defined in P, on P
            submodules = [f"{module}.{alias.name}" for alias in node.names]
            targets = [t for t in submodules if t.removeprefix("vla_edge_ros.") in known]
            if len(targets) < len(submodules):
                targets.append(module)
        else:
            continue
        for target in targets:
            if target == "vla_edge_ros" or target.startswith("vla_edge_ros."):
                local = target.removeprefix("vla_edge_ros").removeprefix(".")
                if local in known:
                    inside.add(local)
            else:
                outside.add(target.split(".")[0])
    inside.discard(name)
    return inside, outside


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    found = modules()
    edges, external = {}, {}
    for name, path in found.items():
        edges[name], external[name] = imports_of(name, path, set(found))
    return edges, external


def unit(module: str) -> str:
    return module.split(".")[0] if module else ""


def layer(module: str) -> int:
    for index, units in enumerate(LAYERS):
        if unit(module) in units:
            return index
    raise AssertionError(f"vla_edge_ros.{module} belongs to no layer: add its package to LAYERS")


def test_every_module_belongs_to_a_layer():
    for name in modules():
        if name:
            layer(name)


def test_no_module_imports_a_higher_layer_or_a_sibling_of_its_own_layer():
    edges, _ = graph()
    wrong = sorted(f"{a} -> {b}" for a, targets in edges.items() if a for b in targets
                   if unit(a) != unit(b) and layer(b) >= layer(a))
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_there_are_no_import_cycles():
    edges, _ = graph()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


def test_only_the_ros_layer_imports_ros():
    _, external = graph()
    wrong = sorted(f"{name} imports {sorted(mods & ROS_MODULES)}" for name, mods in external.items()
                   if mods & ROS_MODULES and unit(name) != "nodes")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_what_it_must_refuse():
    """The walk resolves relative and lazy imports: a planted upward import and a cycle are found."""
    edges, _ = graph()
    assert "memory.base" in edges["engine.vla_engine"]  # a relative import, resolved
    assert "nodes.bringup" in edges["cli.run"]  # an import inside a function counts
    planted = {**edges, "model.arena": edges["model.arena"] | {"engine.vla_engine"}}
    assert any(layer(b) >= layer(a) for a, targets in planted.items() if a for b in targets if unit(a) != unit(b))
