"""Units of work on this process, local workers or Ray: the same results, kept through deaths and interruptions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vla_edge_ros.tools.parallel import Job, Unit, run_units

HERE = Path(__file__).resolve().parent


class ToyError(ValueError):
    """A user error of a package's own (module path test_parallel.ToyError)."""


def prepare(context: dict) -> dict:
    """A toy worker state: what a real one loads once (the model), here a counter of units run."""
    return {"scale": context["scale"], "ran": 0, "pid": os.getpid()}


def work(state: dict, spec: dict) -> dict:
    """A toy unit: deterministic from its spec; may die (SIGKILL to itself) or raise when told to."""
    state["ran"] += 1
    if spec.get("die") and not Path(spec["die"]).exists():
        Path(spec["die"]).write_text("died once")  # the next attempt survives
        os.kill(os.getpid(), signal.SIGKILL)
    if spec.get("always_die"):
        os.kill(os.getpid(), signal.SIGKILL)
    if spec.get("raise"):
        raise ValueError(f"unit {spec['n']} cannot be done")
    if spec.get("raise_lines"):
        raise ToyError(f"unit {spec['n']} cannot be done:\n  not at all")
    if spec.get("bug"):
        return {"n": spec["n"] / 0}
    time.sleep(spec.get("sleep", 0.0))
    if spec.get("blas"):
        from threadpoolctl import threadpool_info

        return {"n": spec["n"], "blas_threads": sorted({pool["num_threads"] for pool in threadpool_info()
                                                         if pool["user_api"] == "blas"})}
    return {"n": spec["n"], "square": spec["n"] ** 2 * state["scale"], "pid": state["pid"]}


def job(scale: int = 1) -> Job:
    return Job(prepare, work, {"scale": scale}, identity=f"toy-{scale}")


def units(count: int, **extra) -> list[Unit]:
    return [Unit(f"u{n:03d}", {"n": n, **extra}) for n in range(count)]


def strip(results: dict) -> dict:
    return {key: {k: v for k, v in value.items() if k != "pid"} for key, value in results.items()}


def test_workers_give_the_results_a_serial_run_gives_and_write_each_unit(tmp_path):
    serial = run_units(job(), units(12), tmp_path / "serial")
    parallel = run_units(job(), units(12), tmp_path / "parallel", workers=2)
    assert strip(serial.results) == strip(parallel.results) and not parallel.failed
    assert len({r["pid"] for r in parallel.results.values()}) == 2  # both workers took units
    files = sorted((tmp_path / "parallel" / "units").glob("*.json"))
    assert [f.stem for f in files] == [f"u{n:03d}" for n in range(12)]
    assert json.loads(files[3].read_text())["result"]["square"] == 9
    assert parallel.backend == "processes" and serial.backend == "serial"


@pytest.mark.parametrize("workers", [1, 2])
def test_units_run_with_one_blas_thread_in_this_process_and_in_workers(tmp_path, workers):
    """Threads change float32 rounding: one BLAS thread on every backend keeps reports backend-independent."""
    from threadpoolctl import threadpool_info

    before = [pool["num_threads"] for pool in threadpool_info()]
    summary = run_units(job(), units(2, blas=True), tmp_path, workers=workers)
    assert [result["blas_threads"] for result in summary.results.values()] == [[1], [1]]
    assert [pool["num_threads"] for pool in threadpool_info()] == before  # this process gets its threads back


def test_a_worker_that_dies_has_its_unit_retried_and_one_that_keeps_dying_is_reported(tmp_path):
    work_units = units(6) + [Unit("dies_once", {"n": 6, "die": str(tmp_path / "marker")}),
                             Unit("always_dies", {"n": 7, "always_die": True}),
                             Unit("raises", {"n": 8, "raise": True})]
    summary = run_units(job(), work_units, tmp_path / "out", workers=2)
    assert summary.results["dies_once"]["square"] == 36  # retried on a fresh worker
    assert set(summary.failed) == {"always_dies", "raises"}
    assert "died 2 times" in summary.failed["always_dies"] and "cannot be done" in summary.failed["raises"]
    assert all(summary.results[f"u{n:03d}"]["square"] == n * n for n in range(6))  # nothing else lost


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_unit_is_its_error_in_one_line_without_a_class_path(tmp_path, workers):
    """What a user reads: a user error's own message, a bug's exception name; never a traceback's last line
    (``test_parallel.ToyError: ...``, as replay printed ``vla_edge_ros.bags.reader.BagError: ...``)."""
    work_units = [Unit("raises", {"n": 0, "raise": True}), Unit("lines", {"n": 1, "raise_lines": True}),
                  Unit("bug", {"n": 2, "bug": True})]
    summary = run_units(job(), work_units, tmp_path, workers=workers)
    assert summary.failed == {"raises": "unit 0 cannot be done", "lines": "unit 1 cannot be done: not at all",
                              "bug": "ZeroDivisionError: division by zero"}


def test_resume_keeps_finished_units_of_the_same_job_only(tmp_path):
    first = run_units(job(), units(4), tmp_path)
    (tmp_path / "units" / "u002.json").unlink()  # as if the run had stopped before this one
    again = run_units(job(), units(4), tmp_path, resume=True)
    assert again.resumed == 3 and strip(again.results) == strip(first.results)
    other = run_units(job(scale=2), units(4), tmp_path, resume=True)  # another configuration: nothing reused
    assert other.resumed == 0 and other.results["u003"]["square"] == 18


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_stops_every_worker_and_leaves_whole_units_for_resume(tmp_path, workers):
    """With workers, and in this process (1), where a unit's failure is caught and the run goes on: the stop
    request is not a unit failure."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from pathlib import Path
        from test_parallel import job, units
        from vla_edge_ros.tools.parallel import run_units
        from vla_edge_ros.runtime.stop_signals import Interrupted, StopSignals
        with StopSignals.installed():
            try:
                run_units(job(), units(40, sleep=0.2), Path({str(tmp_path)!r}), workers={workers})
            except Interrupted:
                sys.exit(3)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list((tmp_path / "units").glob("*.json"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 3, err[-2000:]
    finished = sorted((tmp_path / "units").glob("*.json"))
    assert 4 <= len(finished) < 40 and not list((tmp_path / "units").glob("*.tmp"))
    stored = [json.loads(f.read_text()) for f in finished]
    assert all(s["identity"] == "toy-1" for s in stored)  # each one whole
    for pid in {s["result"]["pid"] for s in stored}:  # the workers went down with the run: no orphan left
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
    resumed = run_units(job(), units(40), tmp_path, resume=True)
    assert resumed.resumed == len(finished) and len(resumed.results) == 40


def test_workers_whose_parent_is_killed_exit_without_a_traceback(tmp_path):
    """SIGKILL leaves the parent no time to stop its workers: each finds its pipe closed (mid-send or waiting
    for a unit) and exits quietly, instead of a BrokenPipeError traceback per worker on the user's terminal."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from pathlib import Path
        from test_parallel import job, units
        from vla_edge_ros.tools.parallel import run_units
        run_units(job(), units(40, sleep=0.2), Path({str(tmp_path)!r}), workers=2)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list((tmp_path / "units").glob("*.json"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.kill()
    _, err = process.communicate(timeout=60)  # EOF once the workers, which share stderr, are gone too
    assert process.returncode == -signal.SIGKILL and "Traceback" not in err, err[-2000:]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").is_file() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


@pytest.mark.slow  # ~45 s, most of it Ray's start; the default tier keeps two workers' replay and Ray's CPU count
def test_evaluate_on_two_workers_and_on_a_local_ray_instance_matches_serial_byte_for_byte(tiny_model, tmp_path):
    """The real job: fixed-cost closed-loop episodes; evaluate.json equal but for the run's timing block."""
    from vla_edge_ros.config import parse_settings
    from vla_edge_ros.runtime.block_costs import parse_cost
    from vla_edge_ros.tools.evaluate import evaluate
    from vla_edge_ros.worlds.sim.world import TaskSpec

    settings = parse_settings({"reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy"}}},
                              "test.yaml")
    args = (settings, TaskSpec(name="cue-reach", time_limit_s=2.0), ["fifo", "aura:random"], [2], 2, 0,
            parse_cost("fixed:encode=8ms,decode=1ms"))

    def report(out: Path, **how) -> str:
        result = evaluate(*args, out, **how)
        result.pop("runtime_s"), result.pop("run")
        return json.dumps(result, sort_keys=True)

    serial = report(tmp_path / "serial")
    assert report(tmp_path / "processes", workers=2) == serial
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'vla_edge_ros[ray]'")
    assert report(tmp_path / "ray", workers=2, ray_address="") == serial


def test_replay_of_a_batch_on_two_workers_writes_what_a_serial_replay_writes(tiny_model, tmp_path):
    """Two bags x two policies as four units: the decisions, predictions and reports are the same files."""
    import yaml

    from vla_edge_ros.cli import main

    bags = [tmp_path / "moving.mcap", tmp_path / "cue.mcap"]
    assert main(["make-bag", "--scenario", "moving", "--out", str(bags[0]), "--seconds", "2", "--size", "64x48"]) == 0
    assert main(["make-bag", "--scenario", "cue-recall", "--out", str(bags[1]), "--seconds", "2"]) == 0
    config = tmp_path / "robot.yaml"
    config.write_text(yaml.safe_dump({"reasoning": {"ros__parameters": {
        "model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 128}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 48, "frame_width": 64}}}))
    common = ["replay", *map(str, bags), "--config", str(config), "--policy", "fifo,dms",
              "--cost", "fixed:encode=8ms,decode=1ms"]
    assert main([*common, "--out", str(tmp_path / "serial")]) == 0
    assert main([*common, "--out", str(tmp_path / "parallel"), "--workers", "2"]) == 0
    for stem in ("00_moving", "01_cue"):
        serial, parallel = tmp_path / "serial" / stem, tmp_path / "parallel" / stem
        for name in ("decisions_fifo.txt", "decisions_dms.txt", "predictions_fifo.csv", "predictions_dms.csv"):
            assert (serial / name).read_bytes() == (parallel / name).read_bytes(), name
        reports = [json.loads((d / "report.json").read_text()) for d in (serial, parallel)]
        for report in reports:
            for policy in report["policies"].values():
                policy.pop("replay")  # wall time and frames per second: timing, not results
        assert reports[0] == reports[1]


def test_ray_without_workers_uses_every_cpu_of_the_cluster(tmp_path, monkeypatch):
    """--ray without --workers once ran one actor, leaving a cluster idle: now one actor per CPU it has."""
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'vla_edge_ros[ray]'")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        address = ray.get_runtime_context().gcs_address
        summary = run_units(job(), units(6, sleep=0.3), tmp_path, ray_address=address)
    finally:
        ray.shutdown()
    assert summary.workers == 3 and not summary.failed
    assert len({result["pid"] for result in summary.results.values()}) == 3  # three actors ran units


def test_a_cluster_that_refuses_this_client_says_what_to_set(tmp_path, monkeypatch):
    """Ray's own answer to a client without a token-authenticated cluster's token is a bare 'Failed to connect'
    (seen against `RAY_AUTH_MODE=token ray start --head`, Ray 2.60); ours says what to set."""
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'vla_edge_ros[ray]'")

    def refuse(**kwargs):
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.9:6379")

    def no_token(**kwargs):
        raise ray.exceptions.AuthenticationError("Token authentication is enabled but no authentication token "
                                                 "was found.")

    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(ValueError, match=r"^cannot connect to the Ray cluster at 10.0.0.9:6379: Failed to connect.*"
                                         r"set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to the cluster's token"):
        run_units(job(), units(2), tmp_path, ray_address="10.0.0.9:6379")
    monkeypatch.setattr(ray, "init", no_token)
    with pytest.raises(ValueError, match=r"no token was found: set RAY_AUTH_TOKEN .* or RAY_AUTH_TOKEN_PATH"):
        run_units(job(), units(2), tmp_path, ray_address="10.0.0.9:6379")


@pytest.mark.slow
def test_a_token_authenticated_cluster_refuses_a_client_without_its_token_in_one_line(tmp_path):
    """The real thing (about 30 s): a head started with RAY_AUTH_MODE=token, and `vla-edge evaluate --ray` from a
    machine (here: a HOME) without the token."""
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'vla_edge_ros[ray]'")
    ray_cli = Path(sys.executable).with_name("ray")
    head_env = {**os.environ, "HOME": str(tmp_path / "head"), "RAY_AUTH_MODE": "token"}
    subprocess.run([str(ray_cli), "get-auth-token", "--generate"], env=head_env, capture_output=True, check=True)
    port = 6300 + os.getpid() % 600
    subprocess.run([str(ray_cli), "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                    "--disable-usage-stats"], env=head_env, capture_output=True, check=True, timeout=120)
    try:
        client = {**os.environ, "HOME": str(tmp_path / "client")}
        done = subprocess.run([sys.executable, "-m", "vla_edge_ros", "evaluate", "--episodes", "1", "--ray",
                               f"127.0.0.1:{port}", "--out", str(tmp_path / "out")],
                              env=client, capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run([str(ray_cli), "stop", "--force"], env=head_env, capture_output=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("vla-edge evaluate: error:")]
    assert len(ours) == 1 and "RAY_AUTH_TOKEN" in ours[0] and "Traceback" not in done.stderr
