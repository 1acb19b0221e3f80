"""A config file is read within bounds: size, nesting, node count; no anchors, aliases or duplicate keys.

A hostile or broken file must cost a command one short line and exit code 2, quickly and in little
memory, never a traceback, a memory blow-up or a hang.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from vla_edge_ros import config
from vla_edge_ros.config import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, MAX_CONFIG_NODES, ConfigError, load_settings

CPU_LIMIT_S = 2.0  # the whole command, interpreter start included
RSS_LIMIT_MB = 200.0
HEAD = "reasoning:\n  ros__parameters:\n"


def laughs(depth: int, key: str = "deadline_ms") -> str:
    """A "billion laughs" value under ``key``: ``depth`` anchored lists of nine aliases of the one before
    (9 ** depth strings once expanded, from about 50 bytes a level)."""
    levels = ["&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, depth)]
    *parents, leaf = key.split(".")
    indent = "    " + "  " * len(parents)
    nesting = "".join(f"{'    ' + '  ' * i}{parent}:\n" for i, parent in enumerate(parents))
    return f"{HEAD}{nesting}{indent}{leaf}: [{', '.join(levels)}]\n"


@dataclass(frozen=True)
class Outcome:
    code: int
    stderr: str
    cpu_s: float
    peak_rss_mb: float


def _guard() -> None:
    """In the child: a runaway is stopped by the kernel (5 CPU seconds, 1 GiB of address space) long before
    it could hurt the machine; the bounds the tests assert are far below these."""
    resource.setrlimit(resource.RLIMIT_CPU, (5, 5))
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


# `python -m vla_edge_ros` that, on its way out, writes its peak resident set (VmHWM) to the file argv[1]. The
# kernel's ru_maxrss cannot be used: a child forked from this test process counts the pages it shared with
# pytest before its exec (406 MB measured inside the full suite, for a command that peaks at 85 MB).
_PEAK_THEN_RUN = """
import atexit, runpy, sys
def peak(out=sys.argv[1]):
    kib = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    open(out, "w").write(kib)
atexit.register(peak)
sys.argv = [sys.argv[0], *sys.argv[2:]]
runpy.run_module("vla_edge_ros", run_name="__main__")
"""


def plan_with(path: Path, wall_s: float = 20.0) -> Outcome:
    """``vla-edge plan --config path`` as a user runs it, with its own CPU time (from wait4: this child's alone;
    CPU time, unlike wall time, does not grow with the machine's load) and peak resident set."""
    with tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as peak:
        proc = subprocess.Popen([sys.executable, "-c", _PEAK_THEN_RUN, peak.name, "plan", "--config", str(path)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=_guard)
        deadline = time.monotonic() + wall_s
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        while not pid:
            if time.monotonic() > deadline:  # a hang (a FIFO opened for reading waits for a writer)
                proc.kill()
            time.sleep(0.01)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
        peak_kib = float(peak.read() or "inf")  # none written: killed before its exit
    return Outcome(proc.returncode, stderr, usage.ru_utime + usage.ru_stime, peak_kib / 1024)


CASES = {
    "laughs-10-deadline_ms": (lambda: laughs(10), "anchors and aliases"),
    "laughs-10-model_dir": (lambda: laughs(10, "model_dir"), "anchors and aliases"),
    "laughs-10-kv.policy": (lambda: laughs(10, "kv.policy"), "anchors and aliases"),
    "laughs-6-deadline_ms": (lambda: laughs(6), "anchors and aliases"),
    # ours says "nested deeper than 32 levels"; libyaml, when it reads, stops at its own limit first
    "nested-1000": (lambda: f"{HEAD}    kv: {'[' * 1000}{']' * 1000}\n", "nest"),
    "duplicate-key": (lambda: f"{HEAD}    deadline_ms: 33.0\n    deadline_ms: 50.0\n",
                      "line 4, column 5: duplicate key 'deadline_ms' (first at line 3)"),
    "oversized": (lambda: f"{HEAD}    deadline_ms: 33.0\n" + "#" * MAX_CONFIG_BYTES + "\n", "larger than"),
    "many-nodes": (lambda: f"{HEAD}    prompt_token_ids: [{', '.join(['1'] * (MAX_CONFIG_NODES + 1))}]\n",
                   f"more than {MAX_CONFIG_NODES:,} YAML nodes"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_config_costs_one_short_line_quickly_in_little_memory(case, tmp_path):
    text, message = CASES[case]
    path = tmp_path / "robot.yaml"
    path.write_text(text())
    outcome = plan_with(path)
    lines = outcome.stderr.splitlines()
    assert outcome.code == 2, outcome.stderr[-300:]
    assert len(lines) == 1 and "Traceback" not in outcome.stderr, outcome.stderr[-300:]
    assert lines[0].startswith(f"vla-edge plan: error: {path}: ") and message in lines[0], lines[0][:300]
    assert len(lines[0]) < 200 + len(str(path)), lines[0][:300]
    assert outcome.cpu_s < CPU_LIMIT_S, outcome
    assert outcome.peak_rss_mb < RSS_LIMIT_MB, outcome


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "directory"])
def test_a_fifo_a_device_or_a_directory_is_refused_without_reading_it(special, tmp_path):
    """A FIFO would block its reader until a writer comes; /dev/zero never ends."""
    path = {"fifo": tmp_path / "robot.yaml", "/dev/zero": Path("/dev/zero"), "directory": tmp_path}[special]
    if special == "fifo":
        os.mkfifo(path)
    outcome = plan_with(path, wall_s=10.0)
    assert outcome.code == 2, outcome
    assert outcome.stderr == f"vla-edge plan: error: cannot read config {path}: not a regular file\n", outcome


def test_the_size_bound_is_one_mib_inclusive(tmp_path):
    path = tmp_path / "robot.yaml"
    body = f"{HEAD}    deadline_ms: 50.0\n"
    path.write_text(body + "#" * (MAX_CONFIG_BYTES - len(body) - 1) + "\n")
    assert path.stat().st_size == MAX_CONFIG_BYTES == 1 << 20
    assert load_settings(path)["reasoning"]["deadline_ms"] == 50.0
    with path.open("a") as more:
        more.write("\n")
    with pytest.raises(ConfigError, match=f"^{path}: larger than 1,048,576 bytes, the most a config file may be$"):
        load_settings(path)


@pytest.fixture(params=config.CONFIG_LOADERS, ids=lambda loader: loader.__name__)
def loader(request, monkeypatch):
    """Each loader this PyYAML offers (libyaml's event parser when built with it, PyYAML's own always)
    holds the same rules."""
    monkeypatch.setattr(config, "ConfigLoader", request.param)
    return request.param


@pytest.mark.parametrize("text, message", [
    ("    deadline_ms: &d 33.0\n", "line 3, column 18: YAML anchors and aliases"),
    ("    kv: {policy: *p}\n", "line 3, column 18: YAML anchors and aliases"),
    ("    kv:\n      dms: {window: 8}\n      dms: {window: 9}\n",
     "line 5, column 7: duplicate key 'dms' (first at line 4)"),
    ("    kv: {policy: fifo, policy: dms}\n", "line 3, column 24: duplicate key 'policy' (first at line 3)"),
    ("    kv.policy: dms\n    kv: {policy: fifo}\n", "reasoning: kv.policy is given twice"),
])
def test_anchors_aliases_and_duplicates_are_refused_where_they_are(loader, tmp_path, text, message):
    path = tmp_path / "robot.yaml"
    path.write_text(HEAD + text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(info.value).startswith(f"{path}: {message}"), info.value


def test_syntax_errors_are_one_line_with_the_place(loader, tmp_path):
    path = tmp_path / "robot.yaml"
    path.write_text(HEAD + "    kv: [unclosed\n")
    with pytest.raises(ConfigError, match=r"not valid YAML: line \d+, column \d+: ") as info:
        load_settings(path)
    assert "\n" not in str(info.value)


def test_the_depth_bound_is_inclusive(loader, tmp_path):
    """The schema's own nesting (node, ros__parameters, kv, cosine, a list) is far inside the bound."""
    path = tmp_path / "robot.yaml"
    deepest = MAX_CONFIG_DEPTH - 3  # the top-level mapping, reasoning's and ros__parameters' are three levels
    path.write_text(HEAD + "    prompt_token_ids: " + "[" * deepest + "]" * deepest + "\n")
    with pytest.raises(ConfigError, match=r"prompt_token_ids\[0\] must be of type int, got list \[\[\["):
        load_settings(path)  # read, then refused by the schema
    path.write_text(HEAD + "    prompt_token_ids: " + "[" * (deepest + 1) + "]" * (deepest + 1) + "\n")
    with pytest.raises(ConfigError, match=f"^{path}: line 3, column {22 + deepest + 1}: nested deeper than "
                                          f"{MAX_CONFIG_DEPTH} levels$"):
        load_settings(path)


@pytest.mark.parametrize("text, message", [
    (f"backend: {'x' * 100_000}", "backend must be one of ['auto', 'numpy', 'cuda'], got 'xxxx"),
    (f"model_dir: [{', '.join(['1'] * 10_000)}]", "model_dir must be of type str, got list [1, 1, "),
    (f"deadline_ms: 1{'0' * 400}", "deadline_ms must be a finite number, got 1000"),
    (f"kv_capacity_tokens: 1{'0' * 4000}", "kv_capacity_tokens=1000"),
    (f"kv_capacity_tokens: 1{'0' * 5000}", "cannot convert a value: Exceeds the limit (4300 digits)"),
])
def test_a_long_value_is_shown_by_a_short_prefix(tmp_path, text, message):
    path = tmp_path / "robot.yaml"
    path.write_text(f"{HEAD}    {text}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert len(str(info.value)) < 200 + len(str(path)) and "\n" not in str(info.value), str(info.value)[:300]
    assert message in str(info.value), str(info.value)[:300]
