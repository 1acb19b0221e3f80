"""The YAML schema: defaults, coercion, and errors that name the key and the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from vla_edge_ros.config import (
    KNOB_GROUPS,
    SCHEMA,
    ConfigError,
    MemoryKnobs,
    _flatten,
    defaults,
    load_settings,
    package_share,
    parse_settings,
    resolve_path,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_YAML = ROOT / "config" / "default.yaml"


def test_the_memory_variants_config_is_the_arms_but_for_its_checkpoint():
    """config/metaworld-memory.yaml reads the arm as config/metaworld.yaml does: only the checkpoint differs, so the
    two files cannot drift apart."""
    arm, memory = (load_settings(ROOT / "config" / name) for name in ("metaworld.yaml", "metaworld-memory.yaml"))
    differ = {(node, key) for node, params in arm.values.items() for key, value in params.items()
              if memory.values[node][key] != value}
    assert differ == {("reasoning", "model_dir")}
    assert memory["reasoning"]["model_dir"] == str(ROOT / "models" / "metaworld-memory")


def test_default_yaml_names_every_parameter_with_the_schema_default():
    """config/default.yaml is the schema's defaults written out: the same keys and the same values, so a
    command run without --config behaves as one run with the shipped file."""
    raw = yaml.safe_load(DEFAULT_YAML.read_text())
    assert set(raw) == set(SCHEMA)
    for node, params in SCHEMA.items():
        written = _flatten(raw[node]["ros__parameters"])
        assert set(written) == {p.name for p in params}, node
        for param in params:
            assert written[param.name] == param.default, f"{node}.{param.name}"
    assert load_settings(DEFAULT_YAML).values == defaults().values


def test_every_knob_group_reads_schema_names_only_and_covers_its_prefix():
    for group in KNOB_GROUPS:
        names = {p.name for p in SCHEMA[group.NODE]}
        assert set(group.keys()) <= names, group
        if group.PREFIX:
            assert {n for n in names if n.startswith(group.PREFIX)} == set(group.keys()), group
    assert MemoryKnobs.of().dms.window == next(p.default for p in SCHEMA["reasoning"] if p.name == "kv.dms.window")


def test_relative_paths_resolve_against_the_yaml_file_then_the_package_share(tmp_path):
    share = package_share()
    assert share is not None and (share / "models" / "sim" / "config.json").is_file()
    assert defaults()["reasoning"]["model_dir"] == str(share / "models" / "sim")
    here = tmp_path / "robot"
    (here / "models" / "mine").mkdir(parents=True)
    config = here / "robot.yaml"
    config.write_text(yaml.safe_dump({"reasoning": {"ros__parameters": {
        "model_dir": "models/mine", "kv_store": {"dir": "kv", "key_file": "~/kv.key"}}}}))
    node = load_settings(config)["reasoning"]
    assert node["model_dir"] == str(here / "models" / "mine")  # beside the YAML file first
    assert node["kv_store.dir"] == str(here / "kv")  # found nowhere: where the YAML file is
    assert node["kv_store.key_file"] == str(Path("~/kv.key").expanduser())
    config.write_text(yaml.safe_dump({"reasoning": {"ros__parameters": {"model_dir": "models/sim"}}}))
    assert load_settings(config)["reasoning"]["model_dir"] == str(share / "models" / "sim")  # then the share
    assert resolve_path("", here) == "" and resolve_path("/abs/x", here) == "/abs/x"


def test_non_finite_numbers_and_group_rules_are_refused_with_the_file_named():
    with pytest.raises(ConfigError, match=r"robot.yaml: reasoning: deadline_ms must be a finite number, got nan"):
        parse_settings({"reasoning": {"ros__parameters": {"deadline_ms": float("nan")}}}, "robot.yaml")
    with pytest.raises(ConfigError, match=r"robot.yaml: action_publisher: action_max\[0\] must be a finite number"):
        parse_settings({"action_publisher": {"ros__parameters": {"action_max": [float("inf")]}}}, "robot.yaml")
    with pytest.raises(ConfigError, match="robot.yaml: reasoning: kv.dms.target_ratio must be 0"):
        parse_settings({"reasoning": {"ros__parameters": {"kv": {"dms": {"target_ratio": 0.5}}}}}, "robot.yaml")


@pytest.mark.parametrize("params, message", [
    ({"extra_image_topics": ["camera/image_raw"]}, "image_topic and extra_image_topics name ['camera/image_raw'] more "
                                                   "than once"),
    ({"extra_image_topics": ["a", "b", "a"]}, "image_topic and extra_image_topics name ['a'] more than once"),
    ({"extra_image_topics": [""]}, "a camera topic or a state joint name is empty"),
    ({"state_joint_names": ["knee", "knee"]}, "state_joint_names name ['knee'] more than once"),
    ({"extra_image_topics": [f"c{i}" for i in range(16)]}, "extra_image_topics must have 0 to 15 values, got 16"),
    ({"state_type": "imu"}, "state_type must be one of ['joint_state', 'odometry']"),
])
def test_an_observation_that_cannot_be_put_together_is_refused(params, message):
    with pytest.raises(ConfigError, match=re.escape(f"robot.yaml: camera_subscriber: {message}")):
        parse_settings({"camera_subscriber": {"ros__parameters": params}}, "robot.yaml")


def test_every_param_has_a_description_and_numbers_have_ranges():
    for params in SCHEMA.values():
        for param in params:
            assert param.description
            if param.kind in (int, float):
                assert param.minimum is not None and param.maximum is not None


@pytest.mark.parametrize("params, message", [
    ({"kv_capacity_tokens": 4}, "below the minimum"),
    ({"kv_capacity_tokens": "big"}, "must be of type int"),
    ({"kv_capacity_tokens": True}, "must be of type int"),
    ({"backend": "tpu"}, "must be one of"),
    ({"prompt_token_ids": [1, -2]}, r"prompt_token_ids\[1\]=-2 is below the minimum"),
    ({"prompt_token_ids": "1,2"}, "must be a list of int"),
    ({"prompt_token_ids": [1, 2.5]}, r"prompt_token_ids\[1\] must be of type int"),
    ({"no_such_key": 1}, "unknown key reasoning.no_such_key"),
])
def test_bad_values_name_the_key_and_file(params, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse_settings({"reasoning": {"ros__parameters": params}}, "robot.yaml")
    assert "robot.yaml" in str(info.value)


def test_structure_errors():
    with pytest.raises(ConfigError, match="unknown node"):
        parse_settings({"planner": {"ros__parameters": {}}}, "x.yaml")
    with pytest.raises(ConfigError, match="ros__parameters"):
        parse_settings({"reasoning": {"kv_capacity_tokens": 8}}, "x.yaml")
    with pytest.raises(ConfigError, match="top level"):
        parse_settings([1, 2], "x.yaml")


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("reasoning: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_settings(tmp_path / "missing.yaml")


def test_array_parameters_from_ros_arrive_as_array_array():
    """The set_parameters service hands double arrays over as array.array, not list."""
    import array

    from vla_edge_ros.config import SCHEMA

    action_max = next(p for p in SCHEMA["action_publisher"] if p.name == "action_max")
    assert action_max.check(array.array("d", [0.5, 2.0]), "x") == [0.5, 2.0]
    with pytest.raises(ConfigError, match="must be a list of float"):
        action_max.check("0.5", "x")
