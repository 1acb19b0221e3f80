"""Declare a node's ROS parameters from the config schema, and hold every change to it.

Each schema entry becomes a declared parameter with its description, read-only flag and range, so
`ros2 param describe` shows what `config.py` enforces. A `--ros-args -p` override of a live parameter
is checked by the schema and applies from the start; one of a read-only parameter is refused with a
warning, because the engine, the arena and the topics were already built from the config file. A `ros2 param set` is validated by the same
`Param.check` as the YAML file: bad values are rejected with the schema's reason and change nothing.
Where rclpy offers a pre-set hook (Iron and later), an integer given for a floating-point parameter
(`ros2 param set /reasoning deadline_ms 25`) is accepted as 25.0 instead of failing on its type;
on Humble rclpy answers with its own "Wrong parameter type" reason.

A managed node (``managed_node.py``) builds its engine and topics when it configures, from its parameters
as they are then, so there a read-only parameter of the schema is one that is read at configure: it is
declared writable, a command-line override of it applies, and a `ros2 param set` of it is accepted while
the node is unconfigured (refused, with the way there, in any other state) and takes effect at the next
configure. A path set through ROS must be absolute: there is no YAML file's directory to resolve it against.
"""

from __future__ import annotations

import array
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType, SetParametersResult
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.node import Node
from rclpy.parameter import Parameter

from ..config import SCHEMA, ConfigError, Param
from .managed_node import ManagedNode

READ_AT_CONFIGURE = "read when the node configures: set it while the node is unconfigured"

_SCALAR_TYPES = {bool: ParameterType.PARAMETER_BOOL, int: ParameterType.PARAMETER_INTEGER,
                 float: ParameterType.PARAMETER_DOUBLE, str: ParameterType.PARAMETER_STRING}
_ARRAY_TYPES = {int: ParameterType.PARAMETER_INTEGER_ARRAY, float: ParameterType.PARAMETER_DOUBLE_ARRAY,
                str: ParameterType.PARAMETER_STRING_ARRAY}


def describe(param: Param, read_at_configure: bool = False) -> ParameterDescriptor:
    """The ROS descriptor of a schema entry (ranges only exist for scalar numbers in ROS); a read-only entry
    of a managed node is ``read_at_configure``: writable, and its constraints say when it may be set."""
    is_list = param.kind is list
    descriptor = ParameterDescriptor(
        name=param.name,
        type=_ARRAY_TYPES[param.item] if is_list else _SCALAR_TYPES[param.kind],
        description=param.description,
        read_only=param.read_only and not read_at_configure,
    )
    constraints = [READ_AT_CONFIGURE] if read_at_configure else []
    if param.choices:
        constraints.append(f"one of {', '.join(map(str, param.choices))}")
    if is_list:
        low, high = param.items
        constraints.append(f"{low} value{'s' if low > 1 else ''}" if low == high else f"{low} to {high} values")
    if param.minimum is not None and (is_list or param.kind not in (int, float)):
        constraints.append(f"each in [{param.minimum:g}, {param.maximum:g}]")
    elif param.kind is int:
        descriptor.integer_range = [IntegerRange(from_value=int(param.minimum), to_value=int(param.maximum), step=0)]
    elif param.kind is float:
        descriptor.floating_point_range = [FloatingPointRange(from_value=float(param.minimum),
                                                              to_value=float(param.maximum), step=0.0)]
    descriptor.additional_constraints = "; ".join(constraints)
    return descriptor


class NodeParameters:
    """A node's validated parameter values, declared from SCHEMA[section] and kept in step with ROS."""

    def __init__(self, node: Node, section: str, initial: dict[str, Any]) -> None:
        self._node = node
        self._specs = {param.name: param for param in SCHEMA[section]}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._validators: list[tuple[str, Callable[[dict[str, Any]], None]]] = []
        self.values: dict[str, Any] = {}
        self._managed = isinstance(node, ManagedNode)
        where = f"/{node.get_name()}"
        overrides = getattr(node, "_parameter_overrides", {})  # --ros-args -p / --params-file (rclpy keeps them)
        for name, spec in self._specs.items():
            value = spec.check(initial.get(name, spec.default), where)
            fixed = spec.read_only and not self._managed  # the node was built from the config file's value
            if fixed and name in overrides and overrides[name].value != value:
                node.get_logger().warning(f"read-only parameter {name}: override {overrides[name].value!r} ignored, "
                                          f"the node runs with {value!r} from the config file")
            try:
                declared = node.declare_parameter(name, value, describe(spec, read_at_configure=self._managed),
                                                  ignore_override=fixed).value
            except (InvalidParameterTypeException, InvalidParameterValueException) as exc:  # a bad override
                raise ConfigError(f"{where}: {exc}") from None
            self.values[name] = self._check(spec, list(declared) if isinstance(declared, (tuple, array.array))
                                            else declared, where)
        if hasattr(node, "add_pre_set_parameters_callback"):  # Iron+, not Humble
            node.add_pre_set_parameters_callback(self._widen_integers)
        node.add_on_set_parameters_callback(self._on_set)

    def __getitem__(self, name: str) -> Any:
        with self._lock:
            return self.values[name]

    def snapshot(self) -> dict[str, Any]:
        """Every value as of now (a copy)."""
        with self._lock:
            return dict(self.values)

    def validate_with(self, validator: Callable[[dict[str, Any]], None], prefix: str = "") -> None:
        """Also check a change to any parameter named ``prefix...`` with ``validator(all values as they would
        be)``; a ValueError rejects it. Changes to other parameters do not run it."""
        self._validators.append((prefix, validator))

    def on_change(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call ``listener`` with {name: value} of every accepted change (from the ROS executor thread)."""
        self._listeners.append(listener)

    def _widen_integers(self, parameters: list[Parameter]) -> list[Parameter]:
        widened = []
        for parameter in parameters:
            spec = self._specs.get(parameter.name)
            if spec is not None and spec.kind is float and parameter.type_ == Parameter.Type.INTEGER:
                parameter = Parameter(parameter.name, Parameter.Type.DOUBLE, float(parameter.value))
            widened.append(parameter)
        return widened

    def _check(self, spec: Param, value: Any, where: str) -> Any:
        """The schema's check; on a managed node, where a path may come through ROS, also an absolute path (the
        config file's own were resolved against its directory)."""
        value = spec.check(value, where)
        if not (self._managed and spec.path and value):
            return value
        if not Path(value).expanduser().is_absolute():
            raise ConfigError(f"{where}: {spec.name} must be an absolute path when set through ROS, got {value!r}")
        return str(Path(value).expanduser())

    def _on_set(self, parameters: list[Parameter]) -> SetParametersResult:
        where = f"/{self._node.get_name()}"
        accepted = {}
        for parameter in parameters:
            spec = self._specs.get(parameter.name)
            if spec is None:  # declared by rclpy itself (use_sim_time, ...): rclpy checks those
                continue
            if self._managed and spec.read_only and self._node.state != "unconfigured":
                node = self._node.get_fully_qualified_name()
                return SetParametersResult(successful=False, reason=(
                    f"{where}: {spec.name} is read-only while the node is {self._node.state}: it is read when the node "
                    f"configures, so set it while unconfigured (ros2 lifecycle set {node} "
                    f"{'deactivate, then ' if self._node.state == 'active' else ''}cleanup)"))
            try:
                accepted[spec.name] = self._check(spec, parameter.value, where)
            except ConfigError as exc:
                return SetParametersResult(successful=False, reason=str(exc))
        with self._lock:
            proposed = {**self.values, **accepted}
        for prefix, validator in self._validators:
            if not any(name.startswith(prefix) for name in accepted):
                continue
            try:
                validator(proposed)
            except ValueError as exc:
                return SetParametersResult(successful=False, reason=f"{where}: {exc}")
        with self._lock:
            self.values.update(accepted)
        for listener in self._listeners:
            listener(accepted)
        return SetParametersResult(successful=True)
