"""Offline replay: deterministic decisions, live buffer and gate semantics, per-frame files, plots, reports,
and clear errors."""

from __future__ import annotations

import csv
import json
import time
from collections import Counter

import numpy as np
import pytest
from replay_inputs import FIXED, camera_bag, replay_config_file, replay_settings, write_moving_bag

from vla_edge_ros.bags import Bag, BagError
from vla_edge_ros.cli import main
from vla_edge_ros.runtime.admission import BlockKind
from vla_edge_ros.runtime.loader import load_engine
from vla_edge_ros.tools.replay import parse_cost, plots, replay_bag
from vla_edge_ros.tools.replay.commands import RecordedCommands
from vla_edge_ros.tools.replay.memory_view import MemoryView
from vla_edge_ros.tools.replay.report import action_error
from vla_edge_ros.tools.replay.runner import recorded_messages
from vla_edge_ros.tools.replay.session import FrameRecord, PolicyRun, replay_policy

POLICIES = ["fifo", "cosine", "aura", "dms"]


@pytest.fixture(scope="module")
def moving_bag(tmp_path_factory):
    return write_moving_bag(tmp_path_factory.mktemp("bags"))


@pytest.fixture
def settings(tiny_model):
    return replay_settings(tiny_model)


@pytest.fixture(scope="module")
def replayed(moving_bag, tiny_model, tmp_path_factory):
    """Every policy over the moving bag under fixed costs: (report, its directory)."""
    out = tmp_path_factory.mktemp("replayed")
    return replay_bag(moving_bag, replay_settings(tiny_model), POLICIES, parse_cost(FIXED), out), out


def _accounted(policy: dict) -> int:
    return (policy["deadline_hits"] + policy["missed"] + policy["refused"] + policy["stale"] + policy["invalid"]
            + policy["dropped"] + sum(policy["bad_frames"].values()))


def _field(line: str, name: str) -> str | None:
    """The value of ``name=`` on a decisions line."""
    return next((part.split("=", 1)[1] for part in line.split() if part.startswith(name + "=")), None)


def _frames(text: str | None) -> list[int]:
    return [] if text in (None, "-", "") else [int(x) for x in text.replace(",", " ").split()]


def test_a_fixed_cost_replay_decides_identically_byte_for_byte(moving_bag, settings, tmp_path):
    reports = [replay_bag(moving_bag, settings, ["fifo", "aura"], parse_cost(FIXED), tmp_path / name, log=print)
               for name in ("a", "b")]
    for name in ("fifo", "aura"):
        for kind in ("decisions_{}.txt", "predictions_{}.csv"):
            first = (tmp_path / "a" / kind.format(name)).read_bytes()
            assert first == (tmp_path / "b" / kind.format(name)).read_bytes()
        assert len((tmp_path / "a" / f"decisions_{name}.txt").read_text().splitlines()) == 60
    for report in reports:
        for policy in report["policies"].values():
            policy.pop("replay")  # wall-clock speed: the only field allowed to differ
    assert reports[0] == reports[1]
    fifo = reports[0]["policies"]["fifo"]
    assert fifo["frames"] == fifo["decoded_frames"] == 60 and _accounted(fifo) == 60
    assert fifo["latency_ms"]["p50"] == pytest.approx(8 + 6 * 1)  # encode + 6 decode steps, nothing else
    assert fifo["action_error"]["compared"] == fifo["actions"] and len(fifo["action_error"]["l1"]) == 7
    assert reports[0]["policies"]["aura"]["memory_bytes"]["peak"] < fifo["memory_bytes"]["peak"]
    for plot in ("latency.png", "timeline.png", "memory.png", "writes.png", "actions.png"):
        assert (tmp_path / "a" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| fifo |" in (tmp_path / "a" / "report.md").read_text()
    assert json.loads((tmp_path / "a" / "report.json").read_text())["schema"] == "vla_edge_ros.replay/4"


def test_the_decisions_file_records_what_the_policy_kept_and_did(moving_bag, tiny_model, tmp_path):
    """Two cosine runs the gate treats identically (every frame admitted at the same times) but whose
    memories keep different frames write different decisions files: the file covers the policy, not only
    admission."""
    files = {}
    for protect in (0, 5):
        settings = replay_settings(tiny_model, **{"kv.cosine.protect_recent_frames": protect})
        replay_bag(moving_bag, settings, ["cosine"], parse_cost(FIXED), tmp_path / str(protect))
        files[protect] = (tmp_path / str(protect) / "decisions_cosine.txt").read_text().splitlines()
    admission = {protect: [line.split()[:5] for line in lines] for protect, lines in files.items()}
    assert admission[0] == admission[5]  # index, arrival, outcome, verdict, ready time
    kept = {protect: [_field(line, "kept") for line in lines] for protect, lines in files.items()}
    assert kept[0] != kept[5]
    for line in files[5]:  # protecting the 5 newest: they are always kept
        index = int(line.split()[0])
        assert set(range(max(0, index - 4), index + 1)) <= set(_frames(_field(line, "kept")))
        assert _field(line, "action") is not None and len(_field(line, "action").split(",")) == 7


@pytest.mark.parametrize("policy", POLICIES)
def test_the_memory_view_names_the_kept_frames_as_the_policy_counts_them(tiny_model, policy):
    """Frames fed straight to an engine, every third one not stored (as when the gate refuses its encode):
    after each, the view's kept frames are as many as the policy says it keeps, every stored frame is kept
    until it is evicted exactly once, and nothing else is ever kept."""
    engine = load_engine(replay_settings(tiny_model, **{"kv.policy": policy})).engine
    view = MemoryView(engine.policy)
    rng = np.random.default_rng(0)
    stored, evicted, previous = [], [], set()
    for index in range(40):
        bag_index = 1000 + index
        if index % 3 != 2:
            prefill = engine.add_frame(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
            engine.decode_action(prefill)
            stored.append(bag_index)
        record = view.after_cycle(bag_index)
        assert record.stored == (index % 3 != 2)
        assert len(record.kept) == engine.memory_stats().frames_kept
        assert set(record.kept) == (previous | ({bag_index} if record.stored else set())) - set(record.evicted)
        assert set(record.evicted) <= previous and set(record.kept) <= set(stored)
        evicted += record.evicted
        previous = set(record.kept)
    assert sorted(evicted + sorted(previous)) == stored  # each stored frame: evicted once, or still kept
    if policy == "fifo":
        assert sorted(previous) == stored[-len(previous):]  # the newest, in a window
    if policy == "aura":
        assert sorted(previous) == [stored[-1]]  # the current frame only
    assert len(view.figure_names) == len(record.figures)


def test_predictions_csv_has_a_row_per_frame_with_action_command_and_memory(replayed, moving_bag):
    report, out = replayed
    with Bag(moving_bag) as bag:
        recorded = [(m.time_ns, np.array(m.msg.data, dtype=np.float64)) for m in bag.messages(["/vla/command"])]
        start_ns = bag.start_ns
    for policy in POLICIES:
        summary = report["policies"][policy]
        with (out / summary["predictions_file"]).open() as file:
            rows = list(csv.DictReader(file))
        decisions = (out / summary["decisions_file"]).read_text().splitlines()
        assert [int(r["frame"]) for r in rows] == list(range(60))
        assert list(rows[0])[:6] == ["frame", "arrival_s", "outcome", "detail", "ready_s", "latency_ms"]
        assert [f"action_{i}" for i in range(7)] + ["command_s"] + [f"command_{i}" for i in range(7)] == \
            list(rows[0])[6:21]
        assert Counter(r["outcome"] for r in rows)["admitted"] == summary["deadline_hits"]
        for row, line in zip(rows, decisions):
            action = [float(row[f"action_{i}"]) for i in range(7)]
            assert action == [float(x) for x in _field(line, "action").split(",")]
            assert _frames(row["kept_frames"]) == _frames(_field(line, "kept"))
            assert _frames(row["evicted_frames"]) == _frames(_field(line, "evicted"))
            ready_ns = start_ns + round(float(row["ready_s"]) * 1e9)
            assert float(row["latency_ms"]) == pytest.approx((float(row["ready_s"]) - float(row["arrival_s"])) * 1e3)
            nearest_ns, command = min(recorded, key=lambda c: abs(c[0] - ready_ns))
            assert float(row["command_s"]) == pytest.approx((nearest_ns - start_ns) / 1e9, abs=1e-6)
            assert [float(row[f"command_{i}"]) for i in range(7)] == pytest.approx(command, rel=1e-7)
            assert int(row["kv_tokens"]) > 0 and int(row["memory_bytes"]) > 0
        if policy == "aura":
            assert all(r["surprise"] != "" for r in rows)  # every frame was stored, so each had a write decision
        if policy == "dms":
            assert all(int(r["slots_held"]) > 0 and float(r["heads_ratio"]) >= 1 for r in rows)
        assert int(rows[-1]["writes"]) == summary["memory_writes"]


def test_the_report_names_the_matched_topics_and_summarises_the_bag(replayed):
    report, out = replayed
    bag = report["bag"]
    assert bag["image_topic"] == "/camera/image_raw" and bag["command_topic"] == "/vla/command"
    assert bag["command_type"] == "std_msgs/msg/Float32MultiArray"
    topics = {t["name"]: t for t in bag["topics"]}
    assert topics["/camera/image_raw"]["role"] == "camera" and topics["/vla/command"]["role"] == "recorded command"
    for topic in topics.values():
        assert topic["messages"] == 60 and topic["rate_hz"] == pytest.approx(30.0, rel=1e-3)
        assert topic["first_s"] == 0.0 and topic["last_s"] == pytest.approx(59 / 30, abs=1e-6)
    text = (out / "report.md").read_text()
    assert "camera `/camera/image_raw` (60 frames, 30.0 Hz); recorded command `/vla/command`" in text
    assert "| `/vla/command` | `std_msgs/msg/Float32MultiArray` | 60 | 30.0 | 0.00 / 1.97 | recorded command |" in text
    assert "| dms | 60 of 60 |" in text and " tokens |" in text and " frames |" in text
    assert "predictions_<policy>.csv" in text


def test_plots_label_every_axis_draw_the_deadline_and_keep_tokens_off_the_frames_axis(moving_bag, settings):
    runs = []
    for policy in ("fifo", "dms"):
        with Bag(moving_bag) as bag:
            runs.append(replay_policy(recorded_messages(bag, "/camera/image_raw"), settings, policy, parse_cost(FIXED)))
    with Bag(moving_bag) as bag:
        commands = RecordedCommands.read(bag, "/vla/command", settings)

    def seconds(t_ns: int) -> float:
        return (t_ns - bag.start_ns) / 1e9

    for fig in (plots.memory_figure(runs, seconds), plots.timeline_figure(runs, seconds),
                plots.actions_figure(runs, commands, seconds)):
        assert all(ax.get_ylabel() for ax in fig.axes) and "(s)" in fig.axes[-1].get_xlabel()
    assert "(bytes" in plots.memory_figure(runs, seconds).axes[0].get_ylabel()
    panels = plots.actions_figure(runs, commands, seconds).axes
    assert len(panels) == 7
    assert [line.get_label() for line in panels[0].get_lines()] == ["recorded command", "fifo", "dms"]
    fig = plots.latency_figure(runs, 33.0)
    ax = fig.axes[0]
    deadline = [line for line in ax.get_lines() if list(line.get_xdata()) == [33.0, 33.0]]
    assert len(deadline) == 1 and "deadline 33 ms" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert "(ms)" in ax.get_xlabel() and "(count)" in ax.get_ylabel()
    fig = plots.writes_figure(runs, seconds)
    by_label = {ax.get_ylabel(): [line.get_label() for line in ax.get_lines()] for ax in fig.axes}
    assert by_label == {"frames (cumulative)": ["fifo"], "tokens (cumulative)": ["dms"]}
    assert all("(s)" in ax.get_xlabel() for ax in fig.axes)


def test_undecodable_frames_are_reported_apart_from_the_deadline_figures(settings, tmp_path):
    path = camera_bag(tmp_path / "odd.mcap", bad=lambda i: i % 2 == 0)
    report = replay_bag(path, settings, ["fifo"], parse_cost(FIXED), tmp_path / "out")
    fifo = report["policies"]["fifo"]
    assert fifo["bad_frames"] == {"unknown_encoding": 10} and fifo["decoded_frames"] == 10
    assert fifo["deadline_hits"] == 10 and fifo["deadline_hit_rate"] == 1.0 and _accounted(fifo) == 20
    assert report["bag"]["command_topic"] is None and fifo["action_error"] is None
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| fifo | 10 of 20 | 10 | 10 (100%) |" in text
    assert "Undecodable frames, skipped as the camera node would and left out of the deadline figures: 10 " \
           "(unknown_encoding: 10)" in text
    with (tmp_path / "out" / "predictions_fifo.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [(r["outcome"], r["detail"]) for r in rows[:2]] == [("bad_frame", "unknown_encoding"),
                                                               ("admitted", "warmup")]
    assert rows[0]["action_0"] == "" and rows[0]["kept_frames"] == ""


def test_a_bag_without_one_decodable_frame_fails_with_exit_2(tiny_model, tmp_path, capsys):
    path = camera_bag(tmp_path / "bad.mcap", bad=lambda i: True)
    with pytest.raises(BagError, match="none of the 20 frames"):
        replay_bag(path, replay_settings(tiny_model), ["fifo", "dms"], parse_cost(FIXED), tmp_path / "api")
    assert not (tmp_path / "api").exists()  # no report of nothing
    config = replay_config_file(tmp_path, tiny_model)
    assert main(["replay", str(path), "--config", str(config), "--policy", "fifo", "--cost", FIXED,
                 "--out", str(tmp_path / "out")]) == 2
    message = (f"{path}: none of the 20 frames on /camera/image_raw could be decoded (unknown_encoding: 20); "
               "nothing was replayed")
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # the rest: progress
    assert errors == [f"vla-edge replay: error: {message}"]
    assert not (tmp_path / "out" / "report.json").exists()


def test_blocks_slower_than_the_frame_rate_drop_frames_and_the_gate_refuses(moving_bag, settings, tmp_path):
    """50 ms per encode at 30 Hz: the buffer overwrites frames while the reasoner is busy, and once warm-up
    is over the gate refuses every cycle it predicts to overrun the 33 ms deadline."""
    report = replay_bag(moving_bag, settings, ["fifo"], parse_cost("fixed:encode=50ms,decode=1ms"), tmp_path)
    fifo = report["policies"]["fifo"]
    decisions = (tmp_path / "decisions_fifo.txt").read_text().splitlines()
    outcomes = Counter(line.split()[2] for line in decisions)
    assert fifo["dropped"] == outcomes["dropped"] > 0
    # warm-up starts three encodes, each 50 ms late for a 33 ms deadline (the decode after each is refused:
    # its deadline has passed); then the gate knows the encode cost and refuses it, except for one recovery
    # attempt after 40 refusals in a row (4 x probe_after), which overruns again
    missed = [line.split()[2:5] for line in decisions if line.split()[2] == "missed"]
    assert missed == [["missed", "warmup", "decode"]] * 4
    refused = [line.split()[3:5] for line in decisions if line.split()[2] == "refused"]
    assert fifo["refused"] == len(refused) >= 40 and all(r[1] == "encode_prefill" for r in refused)
    assert fifo["missed"] == 4
    assert fifo["deadline_hits"] == fifo["actions"] == 0 and _accounted(fifo) == 60


def test_the_buffer_and_the_records_agree_on_dropped_frames(moving_bag, settings):
    with Bag(moving_bag) as bag:
        run = replay_policy(recorded_messages(bag, "/camera/image_raw"), settings, "fifo",
                            parse_cost("fixed:encode=50ms,decode=1ms"))
    assert run.buffer_dropped == run.counts["dropped"] > 0


def test_measured_costs_and_real_time_pacing(moving_bag, tiny_model, tmp_path):
    # the longest deadline the schema allows: with measured costs a busy machine's cycles are long, and a 33 ms
    # deadline would (rightly) have the gate refuse them all; the deadline is tested with fixed costs above
    settings = replay_settings(tiny_model, deadline_ms=1000.0)
    start = time.monotonic()
    report = replay_bag(moving_bag, settings, ["fifo"], parse_cost("measured"), tmp_path, realtime=True)
    assert time.monotonic() - start >= report["bag"]["duration_s"]  # paced by the wall clock
    fifo = report["policies"]["fifo"]
    assert _accounted(fifo) == 60 and fifo["actions"] > 0


def test_action_error_pairs_each_action_with_the_nearest_command():
    run = PolicyRun("fifo", action_dims=3)
    run.frames = [FrameRecord(i, ready - 10_000_000, "admitted", ready_ns=ready, action=np.array(action, np.float32))
                  for i, (ready, action) in enumerate([
                      (1_000_000_000, [0.5, 0.0, 1.0]), (2_000_000_000, [0.0, 0.0, 0.0]),
                      (5_000_000_000, [5.0, 5.0, 5.0]),  # nearest command has no ground truth
                      (9_000_000_000, [9.0, 9.0, 9.0])])]  # no command within 500 ms
    commands = RecordedCommands([(900_000_000, np.array([0.0, np.nan, 0.0])),
                                 (2_100_000_000, np.array([1.0, np.nan, -1.0])), (5_000_000_000, np.full(3, np.nan))])
    error = action_error(run, commands)
    assert error["compared"] == 2
    assert error["l1"] == pytest.approx([0.75, 1.0])  # the unmapped middle dimension is left out
    assert error["rmse"] == pytest.approx([np.sqrt((0.25 + 1) / 2), 1.0])
    assert commands.nearest(9_000_000_000) is None
    tie = RecordedCommands([(1_000_000_000, np.zeros(1)), (1_400_000_000, np.ones(1))])
    assert tie.nearest(1_200_000_000) == 0 and tie.nearest(1_200_000_001) == 1  # a tie goes to the earlier


@pytest.mark.parametrize("text, expected", [
    ("measured", None),
    ("fixed:encode=4ms,decode=1ms", {BlockKind.ENCODE_PREFILL: 4_000_000, BlockKind.DECODE: 1_000_000}),
    ("fixed:decode=250us,encode=2.5ms", {BlockKind.ENCODE_PREFILL: 2_500_000, BlockKind.DECODE: 250_000}),
    ("fixed:encode=2ms,vision=5ms,decode=1ms",
     {BlockKind.ENCODE_PREFILL: 2_000_000, BlockKind.VISION_ENCODE: 5_000_000, BlockKind.DECODE: 1_000_000}),
])
def test_cost_models_parse(text, expected):
    assert parse_cost(text).fixed_ns == expected


def test_a_fixed_cost_model_names_what_it_lacks_for_a_vision_tower():
    plain = parse_cost("fixed:encode=4ms,decode=1ms")
    assert plain.describe() == "fixed:encode=4ms,decode=1ms"  # as before: reports and replay identities unchanged
    plain.require([BlockKind.ENCODE_PREFILL, BlockKind.DECODE])
    with pytest.raises(ValueError, match="lacks vision"):
        plain.require([BlockKind.VISION_ENCODE, BlockKind.ENCODE_PREFILL, BlockKind.DECODE])
    parse_cost("fixed:encode=4ms,vision=6ms,decode=1ms").require([BlockKind.VISION_ENCODE])
    parse_cost("measured").require([BlockKind.VISION_ENCODE])


@pytest.mark.parametrize("text", ["fixed:encode=4ms", "fixed:encode=4s,decode=1ms", "cheap", "fixed:prefill=1ms",
                                  "fixed:vision=4ms,decode=1ms"])
def test_bad_cost_models_are_refused(text):
    with pytest.raises(ValueError):
        parse_cost(text)
