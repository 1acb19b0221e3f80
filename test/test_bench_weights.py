"""bench/bench_weights.py --smoke: every engine, workload, floor and target of the narrow-weights benchmark runs
end to end on a tiny model, and without CTranslate2 the benchmark says how to install it and leaves it out."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "bench_weights.py"
FORMATS = ("float32", "bfloat16", "int8", "int4")


@pytest.mark.slow  # about a minute on 2 cores: torch, transformers and CTranslate2 load and convert
def test_smoke_run_measures_every_engine_and_prints_every_target(tmp_path: Path) -> None:
    out = tmp_path / "weights.json"
    done = subprocess.run([sys.executable, str(BENCH), "--smoke", "--json", str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())
    with_ct2 = importlib.util.find_spec("ctranslate2") is not None
    assert set(results["ms"]) == {"1", "2"}
    for by_workload in results["ms"].values():
        ours = {f"ours {fmt}" for fmt in FORMATS}
        decoders = ours | {"HF eager"} | ({"CT2 float32", "CT2 int8"} if with_ct2 else set())
        for workload in ("layers", "full"):
            assert set(by_workload[workload]) == decoders | {f"floor {fmt}" for fmt in FORMATS}
        assert set(by_workload["prefill"]) == ours | {"HF eager"}
        assert set(by_workload["cycle"]) == ours | {"HF eager", "encode alone"}
        assert all(ms > 0 for times in by_workload.values() for ms in times.values())
    assert set(results["worker_kib"]) == set(FORMATS)
    targets = [target["target"] for target in results["targets"]]
    assert len(targets) == 2 * (7 if with_ct2 else 5) + 2
    for target in targets:
        assert target in done.stdout
    assert ("pip install ctranslate2" in done.stdout) != with_ct2


@pytest.mark.slow  # imports the benchmark, and with it torch and transformers
def test_without_ctranslate2_one_line_names_its_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH.parent))
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 raises ImportError
    import bench_weights

    assert "pip install ctranslate2" in bench_weights.ctranslate2_missing()
