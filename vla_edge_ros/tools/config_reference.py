"""The configuration reference page, written from the schema (``config.SCHEMA``) so that it cannot drift.

``python -m vla_edge_ros.tools.config_reference > docs/reference/configuration.md`` writes it; a test holds
the committed page equal to what this prints, so a knob added, renamed or re-described without the page
fails the suite.
"""

from __future__ import annotations

import json
from typing import Any

from ..config import SCHEMA, Param

HEADER = """# Configuration reference

<!-- Written by `python -m vla_edge_ros.tools.config_reference` from the schema in vla_edge_ros/config.py;
do not edit by hand: a test holds this page equal to the schema. -->

Every parameter of the three nodes, as `config/default.yaml` sets it and as the ROS layer declares it
(`ros2 param describe` shows the same description and range). The file uses the ROS 2 parameter-file
layout: `NODE: {ros__parameters: {...}}`, nested mappings being dotted names (`kv: {aura: {beta: 0.25}}`
is `kv.aura.beta`). **Live** parameters change while the node runs (`ros2 param set`); the others are
read when the node is configured. Relative paths resolve against the YAML file's directory, then the
package's share directory. How a file is read and bounded: [Configuration](../configuration.md).
"""


def reference() -> str:
    """The whole page: one table per node, one row per parameter in schema order."""
    lines = [HEADER]
    for node, params in SCHEMA.items():
        lines += [f"## `{node}`", "", "| parameter | default | allowed | live | description |",
                  "|---|---|---|---|---|"]
        lines += [_row(param) for param in params]
        lines.append("")
    return "\n".join(lines)


def _row(param: Param) -> str:
    live = "no" if param.read_only else "**yes**"
    return (f"| `{param.name}` | {_code(_value(param.default))} | {_allowed(param)} | {live} | "
            f"{_cell(param.description)} |")


def _allowed(param: Param) -> str:
    """Choices, range, list length and element type, file or directory: whatever the schema checks."""
    if param.choices:
        return ", ".join(_code(choice) for choice in param.choices)
    parts = []
    if param.item is not None:
        low, high = param.items
        length = f"{low}" if low == high else f"{low} to {high:,}"
        parts.append(f"list of {length} {param.item.__name__}")
    if param.minimum is not None or param.maximum is not None:
        low = "-inf" if param.minimum is None else f"{param.minimum:g}"
        high = "inf" if param.maximum is None else f"{param.maximum:g}"
        parts.append(f"[{low}, {high}]")
    if param.path:
        parts.append("path")
    if not parts:
        parts.append(type(param.default).__name__)
    return "; ".join(parts)


def _value(value: Any) -> str:
    """A default as YAML writes it (JSON is a subset: lists in brackets, strings quoted, true/false)."""
    return json.dumps(value)


def _code(text: str) -> str:
    return f"`{text}`" if text else '`""`'


def _cell(text: str) -> str:
    """Markdown table cells must not hold a bare pipe."""
    return text.replace("|", "\\|")


if __name__ == "__main__":
    print(reference(), end="")
