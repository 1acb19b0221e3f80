"""The YAML schema: defaults, coercion, and errors that name the key and the file."""

from __future__ import annotations

import pytest

from vla_edge_ros.config import SCHEMA, ConfigError, load_settings, parse_settings


def test_default_yaml_is_valid_and_matches_schema(tmp_path):
    settings = load_settings("config/default.yaml")
    assert set(settings["reasoning"]) == {p.name for p in SCHEMA["reasoning"]}


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
