"""A training recipe file: the phases that make one checkpoint, read and checked here and only here.

A recipe is YAML with one key, ``phases``: a list of phases run in order, each a ``name`` and the keys of one
``TrainSpec`` (``spec.py``: nested mappings for the stages' knobs; a key left out takes its default). The first
phase starts from fresh weights or from ``init_from``, a checkpoint (a relative path resolves against the
recipe file's directory, then the package share); every later phase starts from the weights the phase before
it wrote. Unknown keys, wrong types, values out of range and broken rules between knobs are a ``ConfigError``
that names the file, the phase and the key. The file is read within the bounds of a config file
(``config.load_settings``: no anchors, aliases or duplicate keys, a bounded size).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import ConfigError, Param, read_yaml, resolve_path, shown
from .spec import WORLD_CONFIGS, TrainSpec

PHASES_DIR = "phases"  # under the output directory: the checkpoints of every phase but the last
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a phase's name is part of its directory's
EXPONENT_TEXT = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")  # 3e-4: a float to YAML 1.2, text to PyYAML's YAML 1.1


@dataclass(frozen=True)
class Phase:
    """One run of the trainer: its name (the log's, and its directory's) and everything that decides it."""

    name: str
    spec: TrainSpec


@dataclass(frozen=True)
class Recipe:
    """The phases that make one checkpoint, in the order they run."""

    phases: tuple[Phase, ...]

    def scaled(self, factor: float) -> Recipe:
        """Every phase's steps and demonstrations scaled (``TrainSpec.scaled``): a smoke run of the same recipe."""
        return replace(self, phases=tuple(replace(phase, spec=phase.spec.scaled(factor)) for phase in self.phases))

    def chained(self, out: Path) -> list[tuple[Phase, Path]]:
        """Each phase as it runs, with the directory it writes: the last phase ``out``, the others
        ``out/phases/<n>-<name>``, each later phase starting from the one before it (its ``init_from``)."""
        runs: list[tuple[Phase, Path]] = []
        for number, phase in enumerate(self.phases, start=1):
            where = out if number == len(self.phases) else out / PHASES_DIR / f"{number}-{phase.name}"
            if runs:
                phase = replace(phase, spec=replace(phase.spec, init_from=str(runs[-1][1])))
            runs.append((phase, where))
        return runs


def load_recipe(path: str | Path) -> Recipe:
    """Read and check a recipe file."""
    path = Path(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict) or "phases" not in raw:
        raise ConfigError(f"{path}: a recipe is a mapping with one key, 'phases' (a list of phases)")
    for key in raw:
        if key != "phases":
            raise ConfigError(f"{path}: unknown key {shown(key)}; known: ['phases']")
    items = raw["phases"]
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{path}: phases must be a non-empty list of phases, got {shown(items)}")
    phases: list[Phase] = []
    for number, item in enumerate(items, start=1):
        phases.append(_phase(item, number, path, {phase.name for phase in phases}))
    return Recipe(tuple(phases))


def _phase(item: Any, number: int, path: Path, taken: set[str]) -> Phase:
    where = f"{path}: phase {number}"
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: a phase is a mapping of 'name' and TrainSpec keys, got {shown(item)}")
    name = item.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(f"{where}: name must be 1-64 letters, digits, '_', '-' or '.' (not first), got "
                          f"{shown(name)}")
    if name in taken:
        raise ConfigError(f"{where}: name {name!r} is taken by an earlier phase")
    where = f"{path}: phase {number} ({name})"
    if "init_from" in item and number > 1:
        raise ConfigError(f"{where}: init_from: only the first phase starts from a checkpoint; this one starts "
                          f"from phase {number - 1}'s weights")
    spec = _build(TrainSpec(), {key: value for key, value in item.items() if key != "name"}, where, "")
    if spec.init_from is not None:
        spec = replace(spec, init_from=resolve_path(spec.init_from, path.resolve().parent))
    if spec.drives_policy:
        config = spec.dagger.config or WORLD_CONFIGS[spec.world]
        spec = replace(spec, dagger=replace(spec.dagger, config=resolve_path(config, path.resolve().parent)))
    return Phase(name, spec)


def _build(default: Any, raw: Mapping[Any, Any], where: str, prefix: str) -> Any:
    """``default`` (a spec dataclass) with the keys of ``raw`` checked against its fields and set."""
    fields = {field.name: field for field in dataclasses.fields(default)}
    hints = typing.get_type_hints(type(default))
    values: dict[str, Any] = {}
    for key, value in raw.items():
        label = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(f"{where}: unknown key {shown(label)}; known: {sorted(fields)}")
        if dataclasses.is_dataclass(hints[key]):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {label} must be a mapping of its knobs, got {shown(value)}")
            values[key] = _build(getattr(default, key), value, where, f"{label}.")
        else:
            values[key] = _checked(fields[key], hints[key], value, where, label)
    try:
        return replace(default, **values)
    except ValueError as exc:  # a rule between knobs (``__post_init__``)
        raise ConfigError(f"{where}: {exc}") from None


def _checked(field: dataclasses.Field, kind: Any, value: Any, where: str, label: str) -> Any:
    """``value`` for a leaf field of type ``kind``, checked (and an int made a float) by ``config.Param``'s rules."""
    limits = {name: field.metadata[name] for name in ("minimum", "maximum", "choices")}
    if type(None) in typing.get_args(kind):  # optional: None, or the one other type
        if value is None:
            return None
        (kind,) = (argument for argument in typing.get_args(kind) if argument is not type(None))
    if typing.get_origin(kind) is tuple:  # tuple[item, ...]: a YAML list
        item = typing.get_args(kind)[0]
        return tuple(Param(label, [], field.metadata["doc"], item=item, **limits).check(value, where))
    if kind is float and isinstance(value, str) and EXPONENT_TEXT.fullmatch(value):
        raise ConfigError(f"{where}: {label} must be a number, got the text {shown(value)}: YAML reads an exponent "
                          f"without a dot as text: write 3.0e-4 or 0.0003")
    return Param(label, kind(), field.metadata["doc"], **limits).check(value, where)
