"""Independent units of work, run in this process, on local worker processes, or as Ray tasks, with results
that do not depend on which.

A tool (replay, evaluate, memory-bench) cuts its work into *units*: a key, which names the unit's result
file, and a picklable spec. A ``Job`` says how a worker gets ready once (``prepare(context)``: load the
model) and how it runs one unit (``work(state, spec)`` -> a JSON-able dict). A unit's result must depend
on its spec alone, never on what the worker ran before it; the caller assembles its report from the
results in unit order, so the report is the same whichever worker ran what, and the same as a serial run.

Every result is written as it arrives to ``<out>/units/<key>.json`` (a temporary file, then a rename), so
an interrupted run keeps each finished unit whole, and ``resume`` skips the units whose file is there and
was written for the same job (``Job.identity``: a different configuration never resumes an old run).

Failures. A unit that raises is reported failed with its error in one line (a user error, ValueError or
OSError, as its own message; anything else, a bug, as its exception's name and message, with its traceback
on the worker's stderr); its worker carries on. A worker process that dies (killed, out of memory, a crash
in native code) has its unit run once more on a fresh worker; if that dies too, the unit is reported
failed. Other units are not affected. Ctrl-C / SIGTERM stops every worker and leaves the finished units on
disk.

Backends. ``workers=1`` (or None): this process, in order. ``workers=N``: N spawned processes on this
machine. ``ray=ADDRESS``: one Ray actor per worker on the cluster at ADDRESS (``""``: a Ray instance
started here, of ``workers`` CPUs), each preparing once; ``workers=None`` there means one actor per CPU of
the cluster, so a cluster is used whole unless told otherwise. Inputs (model directory, bags) are read from
paths every node sees, i.e. a shared filesystem; results come back to this process and are written here.
A cluster that refuses this client (not running, or token authentication without the token here) is one
error line saying what to set.

Every backend runs its units with one BLAS thread. N workers share the cores anyway, and a float32 product
split over two threads rounds differently from one on one thread (memory-bench's cue attention moved in the
8th digit), so one thread everywhere is what keeps a report independent of the backend and of the machine.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from ..config import USER_ERRORS
from ..dependencies import missing

UNITS_DIR = "units"


class UnitsFailed(RuntimeError):
    """Some units failed; the finished ones are on disk and ``resume`` runs only the rest."""
RETRIES_AFTER_A_DEATH = 1


@dataclass(frozen=True)
class Unit:
    key: str  # file-name safe: [A-Za-z0-9_.-]
    spec: Any


@dataclass(frozen=True)
class Job:
    """What every worker runs: module-level functions (pickled by reference) and a picklable context."""

    prepare: Callable[[Any], Any]  # context -> state, once per worker
    work: Callable[[Any, Any], dict]  # (state, spec) -> result
    context: Any
    identity: str  # a digest of everything a result depends on besides the spec


@dataclass
class RunSummary:
    results: dict[str, dict] = field(default_factory=dict)  # key -> result, every finished unit
    failed: dict[str, str] = field(default_factory=dict)  # key -> why
    resumed: int = 0  # units read back from an earlier run
    seconds: float = 0.0  # wall time of the run
    busy_seconds: float = 0.0  # CPU time the units took: what one worker with a core to itself would need
    workers: int = 1  # how many ran (on Ray: actors, one CPU each)
    backend: str = "serial"

    @property
    def speedup(self) -> float:
        """Over one worker doing the same units alone: their summed CPU time over the run's wall time (CPU time,
        not wall time, so that workers slowed by sharing cores do not count as work done)."""
        return self.busy_seconds / self.seconds if self.seconds > 0 else 0.0


def run_units(job: Job, units: Sequence[Unit], out: Path, *, workers: int | None = None, ray_address: str | None = None,
              resume: bool = False, progress: Callable[[int, int], None] = lambda done, total: None,
              on_result: Callable[[str, dict], None] = lambda key, result: None) -> RunSummary:
    """Run ``units`` (see the module doc); returns every result and failure, whatever happened to workers.

    ``on_result(key, result)`` is called in this process for each result, resumed ones first, as it arrives:
    work that needs several results (a bag's report) can start while the workers run the other units, on a
    core this process would otherwise leave idle. Every worker has its next unit before it is called."""
    keys = [unit.key for unit in units]
    if len(set(keys)) != len(keys):
        raise ValueError("unit keys must be unique")
    ray = _import_ray() if ray_address is not None else None  # before any output: without it, one line
    directory = out / UNITS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    summary = RunSummary(workers=workers or 1, backend="ray" if ray_address is not None else
                         "processes" if (workers or 1) > 1 else "serial")
    pending = []
    for unit in units:
        earlier = _read(directory / f"{unit.key}.json", job.identity) if resume else None
        if earlier is None:
            pending.append(unit)
        else:
            summary.results[unit.key] = earlier
            summary.resumed += 1
    started = time.perf_counter()
    done = [len(summary.results)]
    for key, result in list(summary.results.items()):
        on_result(key, result)

    def finished(key: str, result: dict | None, error: str | None, seconds: float = 0.0) -> None:
        summary.busy_seconds += seconds
        if result is not None:
            _write(directory / f"{key}.json", job.identity, result)
            summary.results[key] = result
        else:
            summary.failed[key] = error or "failed"
        done[0] += 1
        progress(done[0], len(units))
        if result is not None:
            on_result(key, result)

    progress(done[0], len(units))
    if ray is not None:
        summary.workers = _run_ray(ray, job, pending, workers, ray_address, finished)
    elif summary.workers > 1:
        _run_processes(job, pending, summary.workers, finished)
    else:
        with one_blas_thread():
            state = job.prepare(job.context) if pending else None
            for unit in pending:
                finished(unit.key, *_timed(job, state, unit.spec))
    summary.seconds = time.perf_counter() - started
    return summary


def one_blas_thread() -> Any:
    """Limit BLAS to one thread (see the module doc); as a context manager, until its end."""
    import numpy  # noqa: F401  (loads the BLAS: threadpoolctl limits only the libraries already loaded)
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1, user_api="blas")


def _timed(job: Job, state: Any, spec: Any) -> tuple[dict | None, str | None, float]:
    """(result, None, CPU seconds) or (None, the error, CPU seconds): a unit's failure is reported, the run
    goes on."""
    started = time.process_time()
    try:
        result = job.work(state, spec)
    except Exception as exc:  # noqa: BLE001
        if not isinstance(exc, USER_ERRORS):  # a bug: its traceback goes to stderr for whoever debugs it
            traceback.print_exc(file=sys.stderr)
        return None, failure_line(exc), time.process_time() - started
    return result, None, time.process_time() - started


def failure_line(exc: Exception) -> str:
    """``exc`` as a user reads it, in one line: a user error (what the command line prints as one line) says what
    is wrong itself, so its message alone; a bug gets its exception's name too. Never a traceback or a class path."""
    message = " ".join(str(exc).split())
    if isinstance(exc, USER_ERRORS) and message:
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _write(path: Path, identity: str, result: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"identity": identity, "result": result}, sort_keys=True) + "\n")
    os.replace(temporary, path)


def _read(path: Path, identity: str) -> dict | None:
    """An earlier result of the same job, or None (absent, unreadable, or written for another job)."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return stored["result"] if isinstance(stored, dict) and stored.get("identity") == identity else None


# --- local processes ---------------------------------------------------------------------------------------


def _serve(job: Job, tasks: Connection, results: Connection) -> None:
    """A worker process: prepare once, then run units until told to stop (None)."""
    import signal

    one_blas_thread()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    state = job.prepare(job.context)
    try:
        while (unit := tasks.recv()) is not None:
            results.send((unit.key, *_timed(job, state, unit.spec)))
    except (EOFError, BrokenPipeError):  # the parent was killed: nobody is left to report to, so no traceback
        return


class _Worker:
    """A spawned process with a pipe of its own each way. Nothing is shared between workers (a shared queue
    has a lock, and a worker killed while holding it would block every other worker's results for good),
    and the send happens on the worker's main thread, so a worker killed mid-send can only leave a broken
    message in its own pipe, which reads here as its death."""

    def __init__(self, context: Any, job: Job) -> None:
        task_reader, self.tasks = context.Pipe(duplex=False)
        self.results, result_writer = context.Pipe(duplex=False)
        self.process = context.Process(target=_serve, args=(job, task_reader, result_writer), daemon=True)
        self.process.start()
        task_reader.close(), result_writer.close()  # the worker's ends: once it is gone, reads here see EOF
        self.unit: Unit | None = None

    def give(self, unit: Unit) -> None:
        self.unit = unit
        self.tasks.send(unit)

    def receive(self) -> tuple[str, dict | None, str | None, float] | None:
        """The worker's result, or None when it died before sending one whole."""
        try:
            return self.results.recv()
        except (EOFError, OSError, pickle.UnpicklingError):
            return None

    def stop(self) -> None:
        try:
            self.tasks.send(None)
        except OSError:
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)


def _run_processes(job: Job, pending: Sequence[Unit], workers: int,
                   finished: Callable[[str, dict | None, str | None], None]) -> None:
    context = multiprocessing.get_context("spawn")  # no forked BLAS or numba threads, the same on every OS
    todo = list(pending)
    deaths: dict[str, int] = {}
    pool = [_Worker(context, job) for _ in range(min(workers, len(todo)))]
    try:
        while todo or any(worker.unit is not None for worker in pool):
            for worker in pool:
                if worker.unit is None and todo:
                    worker.give(todo.pop(0))
            busy = [worker for worker in pool if worker.unit is not None]
            wait([conn for worker in busy for conn in (worker.results, worker.process.sentinel)], timeout=1.0)
            for worker in busy:
                if not worker.results.poll() and worker.process.is_alive():
                    continue
                unit = worker.unit
                received = worker.receive()
                if received is None:  # it died on this unit
                    pool.remove(worker)
                    worker.stop()
                    _after_a_death(unit, worker.process.exitcode, todo, deaths, finished)
                    if todo:
                        pool.append(_Worker(context, job))
                    continue
                worker.unit = None
                if todo:
                    worker.give(todo.pop(0))  # before this process handles the result
                finished(*received)
    finally:
        for worker in pool:
            worker.stop()


def _after_a_death(unit: Unit, exitcode: int | None, todo: list[Unit], deaths: dict[str, int],
                   finished: Callable[[str, dict | None, str | None], None]) -> None:
    """A unit whose worker died runs again (once), then it is reported failed."""
    deaths[unit.key] = deaths.get(unit.key, 0) + 1
    if deaths[unit.key] > RETRIES_AFTER_A_DEATH:
        finished(unit.key, None, f"its worker died {deaths[unit.key]} times (exit code {exitcode})")
    else:
        todo.insert(0, unit)


# --- Ray ---------------------------------------------------------------------------------------------------


def _import_ray() -> Any:
    """The ray module, or the one line saying which extra installs it."""
    try:
        import ray
    except ModuleNotFoundError:
        raise missing("ray", "--ray") from None
    return ray


def _run_ray(ray: Any, job: Job, pending: Sequence[Unit], workers: int | None, address: str,
             finished: Callable[[str, dict | None, str | None], None]) -> int:
    """Run ``pending`` on ``workers`` actors (None: one per CPU of the cluster); returns how many there were."""
    _connect(ray, address, workers)
    try:
        workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        actor = ray.remote(num_cpus=1, max_restarts=RETRIES_AFTER_A_DEATH)(_RayWorker)
        pool = [actor.remote(job) for _ in range(min(workers, len(pending)))]
        todo, running, deaths = list(pending), {}, {}
        def feed(handle: Any) -> None:
            if todo:
                unit = todo.pop(0)
                running[handle.run.remote(unit.spec)] = (handle, unit)

        while todo or running:
            for handle in pool:
                if not any(h is handle for h, _ in running.values()):
                    feed(handle)
            ready, _ = ray.wait(list(running), num_returns=1)
            handle, unit = running.pop(ready[0])
            feed(handle)  # before this process handles the result
            try:
                result, error, seconds = ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:  # the worker died; Ray restarts the actor
                deaths[unit.key] = deaths.get(unit.key, 0) + 1
                if deaths[unit.key] > RETRIES_AFTER_A_DEATH:
                    finished(unit.key, None, f"its Ray worker died {deaths[unit.key]} times: {exc}")
                else:
                    todo.insert(0, unit)
                continue
            finished(unit.key, result, error, seconds)
    finally:
        ray.shutdown()
    return workers


_TOKEN = ("RAY_AUTH_TOKEN to the cluster's token (`ray get-auth-token` on its head node prints it), or "
          "RAY_AUTH_TOKEN_PATH to a file holding it")


def _connect(ray: Any, address: str, workers: int | None) -> None:
    """ray.init on the cluster at ``address`` (``""``: a new local instance of ``workers`` CPUs, all when None).

    A client without the token of a cluster that uses token authentication (``RAY_AUTH_MODE=token``; Ray
    turns it on by default from 2.59 for local clusters, 2.61 for all) gets only Ray's "Failed to connect"
    after its retries; ValueError says what to set instead."""
    try:
        ray.init(address=address or None, num_cpus=None if address else workers, include_dashboard=False,
                 log_to_driver=False, ignore_reinit_error=True, configure_logging=False)
    except ray.exceptions.AuthenticationError:
        raise ValueError(f"Ray token authentication is on here (RAY_AUTH_MODE=token) but no token was found: set "
                         f"{_TOKEN}") from None
    except ConnectionError as exc:
        raise ValueError(f"cannot connect to the Ray cluster at {address}: {' '.join(str(exc).split())}. Is it "
                         f"running (`ray status` on its head node)? If it uses token authentication, set "
                         f"RAY_AUTH_MODE=token and {_TOKEN}") from None


class _RayWorker:
    """One Ray actor: prepares once, then runs units (its results go back to the driver, which writes them)."""

    def __init__(self, job: Job) -> None:
        one_blas_thread()
        self.job = job
        self.state = job.prepare(job.context)

    def run(self, spec: Any) -> tuple[dict | None, str | None, float]:
        return _timed(self.job, self.state, spec)


def progress_bar(description: str) -> Callable[[int, int], None]:
    """One progress bar over all units on stderr (tqdm)."""
    from tqdm import tqdm

    bar: list[tqdm] = []

    def update(done: int, total: int) -> None:
        if not bar:
            bar.append(tqdm(total=total, desc=description, unit="unit", file=sys.stderr, dynamic_ncols=True))
        bar[0].update(done - bar[0].n)
        if done == total:
            bar[0].close()
    return update


def run_line(run: dict, seconds: float) -> str:
    """The end-of-run summary: units, rate, who ran them."""
    where = {"ray": f"Ray ({run['ray_address'] or 'local'}, {run['workers']} workers)",
             "processes": f"{run['workers']} local processes"}.get(run["backend"], "this process")
    resumed = f", {run['resumed']} resumed from an earlier run" if run["resumed"] else ""
    return (f"{run['units']} units in {seconds:.1f} s = {run['units_per_s']:.2f} units/s on {where} "
            f"({run['cores']} cores), {run['speedup']:.2f}x one worker, {run['failed']} failed{resumed}")


def run_figures(summaries: Sequence[RunSummary], ray_address: str | None) -> dict[str, Any]:
    """How a run of one or more passes went: wall time, units/s, speed-up, failures, who ran it. Timing
    fields, which differ from run to run (``seconds`` is popped into a report's ``runtime_s``)."""
    seconds = sum(s.seconds for s in summaries)
    busy = sum(s.busy_seconds for s in summaries)
    ran = sum(len(s.results) - s.resumed for s in summaries)
    return {"seconds": seconds, "workers": max((s.workers for s in summaries), default=1),
            "backend": summaries[0].backend if summaries else "serial",
            "ray_address": ray_address, "cores": os.cpu_count(), "units": sum(len(s.results) for s in summaries),
            "resumed": sum(s.resumed for s in summaries), "failed": sum(len(s.failed) for s in summaries),
            "units_per_s": ran / seconds if seconds > 0 else 0.0, "speedup": busy / seconds if seconds > 0 else 0.0}
