"""The import graph, drawn from the code: no cycles, no layer importing one above it, ROS only in nodes/.

Every ``import`` and ``from ... import`` anywhere in a module counts, inside functions too: a lazy import
is still a dependency. The layers, lowest first (docs/ARCHITECTURE.md explains each), are below.

And the experiment harness stays out of what a robot runs: the tools bring their own baselines and
measurements (aura's baseline write gates, the attention probe) instead of the runtime carrying them.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vla_edge_ros"
LAYERS = (
    ("config", "dependencies", "numerics"),  # the schema, the dependency table; NumPy math
    ("worlds",),  # the worlds: the package's own, and Meta-World (whose missing extra the table names)
    ("kernels", "cpu_kernels"),  # Numba-CUDA kernels, Numba-compiled CPU kernels; their NumPy twins
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
HARNESS = ("tools", "train", "cli", "__main__")  # built on the runtime, never run by a robot
ROS_MODULES = {"rclpy", "launch", "launch_ros", "ament_index_python", "builtin_interfaces", "diagnostic_msgs",
               "geometry_msgs", "nav_msgs", "rcl_interfaces", "rosgraph_msgs", "sensor_msgs", "std_msgs", "std_srvs",
               "trajectory_msgs"}


@cache
def modules() -> dict[str, Path]:
    """Dotted name (without the package) -> file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@cache
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def source_module(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` in module ``name`` (file ``path``) imports from."""
    if not node.level:
        return node.module or ""
    base = ["vla_edge_ros"] + (name.split(".") if name else [])
    base = base if path.name == "__init__.py" else base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(package modules, top-level outside modules) that ``name`` imports."""
    inside, outside = set(), set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = source_module(name, path, node)
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


# --- the experiment harness stays out of the runtime ----------------------------------------------------


def local(target: str) -> str:
    return target.removeprefix("vla_edge_ros").removeprefix(".")


@cache
def class_bases() -> dict[str, list[str]]:
    """Every class of the package ('module.Class') -> its bases inside the package, each resolved through the
    module's imports and any package that re-exports it, to the module that defines it."""
    found = modules()
    names: dict[str, dict[str, str]] = {}  # module -> local name -> what it refers to
    defined: dict[str, list[ast.ClassDef]] = {}
    for name, path in found.items():
        tree = parse(path)
        names[name] = {alias.asname or alias.name: local(f"{source_module(name, path, node)}.{alias.name}")
                       for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        defined[name] = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    classes = {f"{module}.{node.name}" for module, nodes in defined.items() for node in nodes}

    def resolve(target: str) -> str:
        while target not in classes and target.rpartition(".")[0] in names:
            module, _, attr = target.rpartition(".")
            if attr not in names[module]:
                break
            target = names[module][attr]
        return target

    def base_of(module: str, base: ast.expr) -> str | None:
        if isinstance(base, ast.Name):
            return resolve(names[module].get(base.id, f"{module}.{base.id}"))
        if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id in names[module]:
            return resolve(f"{names[module][base.value.id]}.{base.attr}")
        return None

    return {f"{module}.{node.name}": [b for b in (base_of(module, base) for base in node.bases) if b in classes]
            for module, nodes in defined.items() for node in nodes}


def subclasses_of(root: str) -> set[str]:
    bases = class_bases()
    found, grew = {root}, True
    while grew:
        more = {cls for cls, of in bases.items() if found & set(of)}
        grew = not more <= found
        found |= more
    return found - {root}


def test_the_runtime_ships_one_aura_write_gate_and_the_baselines_live_with_the_tools():
    """aura's write gate is a strategy: the runtime defines the gate a robot runs, the surprise gate, and
    nothing else; the baselines only evaluation runs (random, periodic, no-write) are the tools' gates."""
    gates = subclasses_of("memory.aura_gate.WriteGate")
    assert {g for g in gates if unit(g) not in HARNESS} == {"memory.aura_gate.SurpriseGate"}
    assert {"tools.aura_gates.RandomGate", "tools.aura_gates.PeriodicGate", "tools.aura_gates.NoWriteGate"} <= gates


def test_the_class_walk_follows_imports_and_re_exports():
    bases = class_bases()
    assert bases["memory.aura.AuraPolicy"] == ["memory.base.MemoryPolicy"]  # a relative import
    assert "model.backend.Backend" in bases["model.numpy_backend.NumpyBackend"]
    assert {"memory.fifo.FifoPolicy", "memory.dms.DmsPolicy"} <= subclasses_of("memory.base.MemoryPolicy")


RANDOM_SOURCES = {"random", "default_rng", "Generator", "RandomState", "urandom", "secrets"}


def random_sources(path: Path) -> list[str]:
    """Lines of ``path`` that import or call a random number generator."""
    lines = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            used = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            used = {(node.module or "").split(".")[-1]} | {alias.name for alias in node.names}
        elif isinstance(node, ast.Attribute):
            used = {node.attr}
        elif isinstance(node, ast.Name):
            used = {node.id}
        else:
            continue
        if used & RANDOM_SOURCES:
            lines.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return sorted(set(lines))


def test_memory_decisions_draw_no_random_numbers():
    """A replay decides the same way every run: what the memory keeps and writes is a function of the frames
    alone, so no policy, gate or engine code draws a random number (a random baseline belongs to the tools)."""
    found = [line for name, path in modules().items() if unit(name) in ("memory", "engine")
             for line in random_sources(path)]
    assert not found, "random number sources in memory decisions:\n" + "\n".join(found)
    assert random_sources(PACKAGE / "tools" / "aura_gates.py")  # the checker sees one where there is one


def frame_path() -> dict[str, ast.FunctionDef]:
    """What runs per frame: every backend's ``forward``, and the engine's public methods."""
    found = modules()
    backends = subclasses_of("model.backend.Backend") | {"model.backend.Backend"}
    path = {}
    for cls in backends | {"engine.vla_engine.VlaEngine"}:
        module, _, name = cls.rpartition(".")
        node = next(n for n in parse(found[module]).body if isinstance(n, ast.ClassDef) and n.name == name)
        for method in (n for n in node.body if isinstance(n, ast.FunctionDef)):
            if method.name == "forward" or (cls.endswith("VlaEngine") and not method.name.startswith("_")):
                path[f"{cls}.{method.name}"] = method
    return path


def options(method: ast.FunctionDef) -> list[tuple[int | None, str]]:
    """(position or None if keyword-only, name) of each parameter with a default."""
    positional = method.args.posonlyargs + method.args.args
    first_default = len(positional) - len(method.args.defaults)
    found = [(index - 1, arg.arg) for index, arg in enumerate(positional) if index >= first_default]  # - self
    return found + [(None, arg.arg) for arg, default in zip(method.args.kwonlyargs, method.args.kw_defaults)
                    if default is not None]


@cache
def runtime_calls() -> dict[str, set[str | int]]:
    """Method name -> the parameter names and positions its calls (any receiver) set in the runtime; '*' when a
    call splats its arguments."""
    calls: dict[str, set[str | int]] = {}
    for name, path in modules().items():
        if not name or unit(name) in HARNESS:
            continue
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                set_ = calls.setdefault(node.func.attr, set())
                set_ |= set(range(len(node.args))) | {k.arg for k in node.keywords if k.arg is not None}
                if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                    set_.add("*")
    return calls


def set_by_runtime(method: str) -> set[str | int]:
    return runtime_calls().get(method, set())


def harness_only_options(path: dict[str, ast.FunctionDef]) -> list[str]:
    """'Class.method(option)' for each optional parameter of ``path`` that no runtime call sets."""
    unused = []
    for qualified, method in path.items():
        set_ = set_by_runtime(method.name)
        unused += [f"{qualified}({name})" for position, name in options(method)
                   if "*" not in set_ and name not in set_ and position not in set_]
    return sorted(unused)


def test_every_option_of_the_frame_path_is_one_the_runtime_sets():
    """A switch on the per-frame path that only the tools turn on (a measurement riding along the forward
    pass, as the attention probe did) is harness in the runtime: a tool takes its measurement beside the
    path (tools/memory_bench/attention.py). Every optional parameter of every backend's ``forward`` and of
    the engine's public methods must be set somewhere in the runtime (a switch the runtime only passes on is
    caught where it enters)."""
    unused = harness_only_options(frame_path())
    assert not unused, "frame-path options only the harness sets:\n" + "\n".join(unused)


def test_the_frame_path_check_sees_what_it_must_refuse():
    path = frame_path()
    assert {"model.numpy_backend.NumpyBackend.forward", "model.cuda_backend.CudaBackend.forward",
            "engine.vla_engine.VlaEngine.prefill_frame"} <= path.keys()
    assert (None, "rope_positions") in options(path["model.backend.Backend.forward"])
    assert {"token_ids", "rope_positions", 0, 1} <= set_by_runtime("forward")  # by keyword and by position
    planted = ast.parse("def add_frame(self, image, *, probe_attention=False): ...").body[0]
    assert harness_only_options({"VlaEngine.add_frame": planted}) == ["VlaEngine.add_frame(probe_attention)"]
