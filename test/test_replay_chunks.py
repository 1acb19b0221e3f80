"""Replay of a chunked model: every action of every chunk, beside the recorded command for its moment."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from replay_inputs import FIXED, replay_settings, write_moving_bag

from vla_edge_ros.bags import Bag
from vla_edge_ros.tools.replay import parse_cost, replay_bag
from vla_edge_ros.tools.replay.commands import MAX_GAP_MS

H = 4


@pytest.fixture(scope="module")
def chunked(tmp_path_factory):
    """The moving bag replayed under fifo with a random tiny model whose mlp head gives 4 actions a cycle."""
    from vla_edge_ros.model.init_model import preset, write_random_model

    root = tmp_path_factory.mktemp("chunks")
    model = write_random_model(root / "m", preset("tiny", layers=1, head="mlp", chunk=H), seed=4)
    bag = write_moving_bag(root)
    out = root / "out"
    return replay_bag(bag, replay_settings(model), ["fifo"], parse_cost(FIXED), out), out, bag


def _rows(path):
    with path.open() as file:
        return list(csv.DictReader(file))


def test_each_frame_s_chunk_is_written_a_row_per_action_at_the_moment_it_is_meant_for(chunked):
    report, out, bag_path = chunked
    summary = report["policies"]["fifo"]
    assert summary["chunks_file"] == "chunks_fifo.csv"
    chunks, predictions = _rows(out / "chunks_fifo.csv"), _rows(out / "predictions_fifo.csv")
    assert list(chunks[0]) == (["frame", "step", "t_s", "due_before_ready"] + [f"action_{i}" for i in range(7)]
                               + ["command_s"] + [f"command_{i}" for i in range(7)])
    acted = [row for row in predictions if row["action_0"]]
    assert len(acted) == summary["actions"] > 10 and len(chunks) == H * len(acted)
    with Bag(bag_path) as bag:
        recorded = [(m.time_ns - bag.start_ns, np.array(m.msg.data, dtype=np.float64))
                    for m in bag.messages(["/vla/command"])]
    period_s = 1 / 30
    for frame, rows in zip(acted, (chunks[i:i + H] for i in range(0, len(chunks), H))):
        assert [int(r["frame"]) for r in rows] == [int(frame["frame"])] * H
        assert [int(r["step"]) for r in rows] == list(range(H))
        # step 0 is the predictions CSV's action: the one for the frame's own time
        assert [rows[0][f"action_{i}"] for i in range(7)] == [frame[f"action_{i}"] for i in range(7)]
        assert len({tuple(r[f"action_{i}"] for i in range(7)) for r in rows}) > 1  # a chunk, not one action 4 times
        for row in rows:
            due = float(frame["arrival_s"]) + int(row["step"]) * period_s
            assert float(row["t_s"]) == pytest.approx(due, abs=2e-6)
            assert row["due_before_ready"] == str(int(float(row["t_s"]) < float(frame["ready_s"])))
            nearest = min(recorded, key=lambda c: abs(c[0] / 1e9 - due))
            if abs(nearest[0] / 1e9 - due) * 1e3 <= MAX_GAP_MS:
                assert float(row["command_s"]) == pytest.approx(nearest[0] / 1e9, abs=2e-6)
                assert [float(row[f"command_{i}"]) for i in range(7)] == pytest.approx(nearest[1].tolist(), abs=1e-6)
    assert {r["due_before_ready"] for r in chunks} == {"0", "1"}  # 8 ms cycles: step 0 is past, the rest ahead
    assert "chunks_<policy>.csv" in (out / "report.md").read_text()


def test_a_model_of_one_action_a_cycle_writes_no_chunks_file(tiny_model, tmp_path):
    report = replay_bag(write_moving_bag(tmp_path), replay_settings(tiny_model), ["fifo"], parse_cost(FIXED),
                        tmp_path / "out")
    assert "chunks_file" not in report["policies"]["fifo"]
    assert not list((tmp_path / "out").glob("chunks_*")) and "chunks_" not in (tmp_path / "out" / "report.md").read_text()
