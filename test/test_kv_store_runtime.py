"""The KV store in the runtime: a restarted robot remembers, ~/save_memory over ROS, and `vla-edge kv-store`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from vla_edge_ros.cli import main
from vla_edge_ros.config import parse_settings
from vla_edge_ros.runtime.loader import load_engine
from vla_edge_ros.worlds.synthetic import SyntheticCamera


def _config(tiny_model, store_dir, key_file, **store) -> dict:
    return {"reasoning": {"ros__parameters": {
        "model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 128,
        "kv_store": {"dir": str(store_dir), "key_file": str(key_file), **store}}}}


def _settings(tiny_model, store_dir, key_file, **store):
    return parse_settings(_config(tiny_model, store_dir, key_file, **store), "test.yaml")


def _snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "kv.key"
    assert main(["kv-store", "keygen", "--out", str(path)]) == 0
    return path


def test_a_restarted_engine_loads_its_prompt_and_remembers_its_episode(tiny_model, tmp_path, key_file):
    from vla_edge_ros.kv_store import save_memory

    settings = _settings(tiny_model, tmp_path / "store", key_file)
    first = load_engine(settings)
    assert (first.prompt_from_store, first.memory_restored) == (False, False)
    camera = SyntheticCamera(height=48, width=64, seed=3)
    for _ in range(5):
        first.engine.step(camera.frame())
    save_memory(first.engine, first.store, "episode")

    second = load_engine(settings)
    assert (second.prompt_from_store, second.memory_restored) == (True, True)
    assert second.engine.memory_stats().frames_kept == first.engine.memory_stats().frames_kept == 5

    off = load_engine(_settings(tiny_model, tmp_path / "store", key_file, prompt=False, memory=False))
    assert (off.prompt_from_store, off.memory_restored) == (False, False)
    assert off.engine.memory_stats().frames_kept == 0


def test_a_bad_key_setup_is_a_clear_error_before_anything_runs(tiny_model, tmp_path, key_file):
    key_file.chmod(0o640)
    with pytest.raises(ValueError, match="accessible by group or others"):
        load_engine(_settings(tiny_model, tmp_path / "store", key_file))
    with pytest.raises(ValueError, match="cannot read key file"):
        load_engine(_settings(tiny_model, tmp_path / "store", tmp_path / "missing.key"))


def test_a_store_of_another_key_stops_the_start_and_is_left_as_it_was(tiny_model, tmp_path, key_file, capsys):
    from vla_edge_ros.kv_store import save_memory

    store_dir, other = tmp_path / "store", tmp_path / "other.key"
    assert main(["kv-store", "keygen", "--out", str(other)]) == 0
    first = load_engine(_settings(tiny_model, store_dir, key_file))
    first.engine.step(SyntheticCamera(height=48, width=64, seed=3).frame())
    save_memory(first.engine, first.store, "episode")
    first.store.close()
    before = _snapshot(store_dir)

    with pytest.raises(ValueError, match=r"^test\.yaml: reasoning: KV store .* is bound to another key .*: not opened, "
                                         r"nothing was changed\. Use the key it was made with, re-key it"):
        load_engine(_settings(tiny_model, store_dir, other))
    with pytest.raises(ValueError, match="is encrypted .* opened without encryption"):
        load_engine(_settings(tiny_model, store_dir, key_file, encryption="none"))
    config = tmp_path / "robot.yaml"  # what an operator running a command sees: one line, exit 2
    config.write_text(yaml.safe_dump(_config(tiny_model, store_dir, other)))
    capsys.readouterr()
    assert main(["engine", "--config", str(config), "--frames", "1"]) == 2
    assert main(["kv-store", "verify", "--dir", str(store_dir), "--key-file", str(other)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 2 and "Traceback" not in captured.err
    assert lines[0].startswith(f"vla-edge engine: error: {config}: reasoning: KV store {store_dir} is bound to")
    assert lines[1].startswith(f"vla-edge kv-store: error: KV store {store_dir} is bound to another key")
    assert _snapshot(store_dir) == before

    assert main(["kv-store", "rekey", "--dir", str(store_dir), "--key-file", str(key_file)]) == 2  # no new key
    assert main(["kv-store", "rekey", "--dir", str(store_dir), "--key-file", str(key_file),
                 "--new-key-file", str(other)]) == 0
    assert "re-sealed 2 blocks" in capsys.readouterr().out
    assert main(["kv-store", "verify", "--dir", str(store_dir), "--key-file", str(other),
                 "--model", str(tiny_model)]) == 0
    assert "2 of 2 blocks verified" in capsys.readouterr().out
    restarted = load_engine(_settings(tiny_model, store_dir, other))
    assert (restarted.prompt_from_store, restarted.memory_restored) == (True, True)
    restarted.store.close()
    with pytest.raises(ValueError, match="bound to another key"):
        load_engine(_settings(tiny_model, store_dir, key_file))

    rekeyed = _snapshot(store_dir)
    assert main(["kv-store", "wipe", "--dir", str(store_dir)]) == 2
    assert "pass --yes" in capsys.readouterr().err and _snapshot(store_dir) == rekeyed
    assert main(["kv-store", "wipe", "--dir", str(store_dir), "--yes"]) == 0
    fresh = load_engine(_settings(tiny_model, store_dir, key_file))  # the old key starts it afresh
    assert (fresh.prompt_from_store, fresh.memory_restored) == (False, False)


def test_kv_store_command_lists_verifies_collects_and_removes(tiny_model, tmp_path, key_file, capsys):
    store_dir = tmp_path / "store"
    load_engine(_settings(tiny_model, store_dir, key_file))  # writes the prompt block
    capsys.readouterr()
    assert main(["kv-store", "ls", "--dir", str(store_dir), "--model", str(tiny_model)]) == 0
    listing = capsys.readouterr().out
    assert "prompt" in listing and "aes-256-gcm" in listing and "1 blocks" in listing and " *" in listing
    assert "store: bound to key " in listing
    assert main(["kv-store", "verify", "--dir", str(store_dir), "--key-file", str(key_file),
                 "--model", str(tiny_model)]) == 0

    block = next(store_dir.glob("*.kvb"))
    data = bytearray(block.read_bytes())
    data[-1] ^= 0x80
    block.write_bytes(bytes(data))
    assert main(["kv-store", "verify", "--dir", str(store_dir), "--key-file", str(key_file)]) == 1
    assert "authentication failed" in capsys.readouterr().out

    assert main(["kv-store", "rm", "--dir", str(store_dir), "ffff"]) == 2
    assert main(["kv-store", "rm", "--dir", str(store_dir), block.name[:12]]) == 0
    assert not block.exists()
    load_engine(_settings(tiny_model, store_dir, key_file))
    assert main(["kv-store", "gc", "--dir", str(store_dir), "--budget-bytes", "0"]) == 0
    assert list(store_dir.glob("*.kvb")) == []
    assert main(["kv-store", "ls", "--dir", str(tmp_path / "nowhere")]) == 2


@pytest.mark.ros
def test_save_memory_service_and_shutdown_save_over_ros(tiny_model, tmp_path, key_file):
    pytest.importorskip("rclpy")
    from rclpy.node import Node
    from std_srvs.srv import Trigger

    from ros_graph import WAIT_S, call, private_graph
    from vla_edge_ros.nodes.reasoning import ReasoningNode
    from vla_edge_ros.runtime.action_slot import ActionSlot
    from vla_edge_ros.runtime.frame_buffer import FrameBuffer

    settings = _settings(tiny_model, tmp_path / "store", key_file, memory_name="arm_left")
    # the longest deadline the schema allows: a 33 ms one would have the gate refuse cycles on a loaded
    # machine, and frames must reach the engine for there to be a memory to save
    settings = settings.replace("reasoning", {"deadline_ms": 1000.0})
    buffer = FrameBuffer(48, 64)
    camera = SyntheticCamera(height=48, width=64, seed=4)
    with private_graph() as (context, executor):
        node = ReasoningNode(buffer, ActionSlot(), settings, context=context)
        user = Node("user", context=context)
        executor.add_node(node)
        executor.add_node(user)
        node.transition("configure")
        node.transition("activate")
        deadline = time.monotonic() + WAIT_S
        while node.engine.memory_stats().frames_kept < 3:
            assert time.monotonic() < deadline, "the engine kept no 3 frames"
            buffer.write(camera.frame(), stamp_ns=0, receive_ns=time.monotonic_ns())
            time.sleep(1 / 30)
        answer = call(executor, user.create_client(Trigger, "/reasoning/save_memory"), Trigger.Request())
        assert answer.success, answer.message
        assert "episode memory saved" in answer.message and node.memory_saves == 1
        values = {kv.key: kv.value for kv in node.report().values}
        assert values["kv_store_writes"] == "2" and values["kv_store_failures"] == "none"
        node.transition("deactivate")  # saves again on the way down
        assert node.memory_saves == 2
        kept = node.engine.memory_stats().frames_kept
        node.destroy_node()
        user.destroy_node()
    restarted = load_engine(settings)
    assert restarted.memory_restored and restarted.engine.memory_stats().frames_kept == kept
