"""bench/latency_sweep.py: evaluate at fixed latencies, every execution mode side by side, as a table and a plot.

Built and checked on a random chunked model (the trained one does not exist yet): the machinery, not the figures.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from vla_edge_ros.config import parse_settings
from vla_edge_ros.model.init_model import preset, write_random_model

BENCH = Path(__file__).resolve().parents[1] / "bench" / "latency_sweep.py"


def _bench():
    spec = importlib.util.spec_from_file_location("latency_sweep", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def chunk8_config(tmp_path_factory) -> Path:
    """A config naming a random 1-layer tiny model with an mlp head of 8 actions (the sim world's 96x96 frames)."""
    root = tmp_path_factory.mktemp("sweep")
    model = write_random_model(root / "m", preset("tiny", layers=1, head="mlp", chunk=8), seed=2)
    path = root / "config.yaml"
    path.write_text(f"reasoning:\n  ros__parameters:\n    model_dir: {model}\n    backend: numpy\n"
                    "camera_subscriber:\n  ros__parameters:\n    frame_height: 96\n    frame_width: 96\n")
    return path


def test_each_latency_is_a_cycle_of_exactly_that_cost(chunk8_config):
    bench = _bench()
    settings = parse_settings({"reasoning": {"ros__parameters": {"model_dir": str(chunk8_config.parent / "m")}}},
                              "t.yaml")
    assert bench.cycle_costs(settings, 300, 5.0).describe() == "fixed:encode=300ms,decode=5ms"  # mlp: no decode
    bins = write_random_model(chunk8_config.parent / "bins", preset("tiny", layers=1), seed=1)  # 6 decode steps
    settings = settings.replace("reasoning", {"model_dir": str(bins)})
    assert bench.cycle_costs(settings, 100, 5.0).describe() == "fixed:encode=70ms,decode=5ms"
    with pytest.raises(ValueError, match="cannot hold 6 decode blocks"):
        bench.cycle_costs(settings, 20, 5.0)


def test_a_sweep_writes_a_row_per_latency_and_mode_a_table_and_a_plot(chunk8_config, tmp_path, capsys):
    out = tmp_path / "sweep"
    code = _bench().main(["--config", str(chunk8_config), "--latencies", "10,300", "--execution", "sync,rtc",
                          "--episodes", "1", "--time-limit-s", "1", "--budget", "2", "--out", str(out)])
    assert code == 0
    rows = json.loads((out / "latency_sweep.json").read_text())
    assert [(r["latency_ms"], r["execution"]) for r in rows] == [
        (None, None), (10, "sync"), (10, "rtc"), (300, "sync"), (300, "rtc")]
    by = {(r["latency_ms"], r["execution"]): r for r in rows}
    # 8 actions (267 ms) cannot carry a 300 ms model: every chunk comes too late to command any of its actions,
    # so the 1 s episode never warms up (no rate once warm); at 10 ms a new command every tick
    assert by[(10, "rtc")]["distinct_commands_hz"] == 30.0 and by[(300, "rtc")]["distinct_commands_hz"] is None
    table = (out / "latency_sweep.md").read_text()
    assert table.count("\n| ") == 6 and "| 300 | rtc |" in table and "| - | expert |" in table
    assert (out / "latency_sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "L300" / "evaluate.json").is_file() and "latency_sweep.md" in capsys.readouterr().out


def test_a_bad_latency_or_mode_is_refused():
    bench = _bench()
    with pytest.raises(SystemExit):
        bench.main(["--latencies", "0"])
    with pytest.raises(SystemExit):
        bench.main(["--execution", "fast"])
