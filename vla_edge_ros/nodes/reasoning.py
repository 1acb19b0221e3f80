"""The reasoning node: newest frame -> admission gate -> encode + prefill -> decode -> action.

Runs on its own thread, never on the executor: a cycle takes milliseconds and must not delay the
camera callback or the publisher timer. It always takes the newest frame from the buffer (no
backlog), asks the gate before every block, and on a refusal simply goes back to the buffer: the
action publisher keeps serving the last action until it goes stale.

A managed node (``managed_node.py``): configure loads the engine with ``runtime/loader.load_engine``
from the node's parameters as they are then (plan the memory and refuse what exceeds the budget, load
the model, open the KV store, prefill or load the pinned prompt, restore the episode memory); activate
starts the reasoning thread; deactivate stops it, withdraws the last action from the slot, so an
active publisher commands a stop from its next tick rather than an answer to an old frame, and saves
the episode memory when the store is configured to; cleanup drops the engine, and the memory it held
with it. A failed configure leaves the node unconfigured with the reason (``ManagedNode.failure``).

A chunked model whose chunks the publisher's timeline executes (``action_publisher.execution`` other than sync)
is planned on the horizon (``runtime/admission.py``): before taking a frame the loop waits until the moment the
next chunk should take over (the end of the held chunk's execution horizon in rtc and ensemble, where the
commands the timeline holds run out in chunk) comes within the predicted cycle, and that moment is the cycle's
deadline (``horizon``, handed over by bringup; without it, the fixed ``deadline_ms``).

Live changes reach the engine between cycles, on the reasoning thread: gate knobs at once, memory
policy knobs (``kv.*``) at the start of the next cycle, and a new ``kv.policy`` at the next episode,
which the ``~/reset_episode`` service (std_srvs/Trigger) starts: the cache restarts from the pinned
prompt under the configured policy, the slot's chunks are withdrawn (``ActionSlot.new_episode``: the publisher
stops until the new episode's first chunk and blends nothing of the old episode's into it), and no frame received
before the request starts the new episode (a simulator that resets its world asks first, then shows the new
layout). While unconfigured a change is only kept, for the next configure.

A new instruction (``instruction_topic`` or the ``instruction`` parameter: ``instruction_input.py``) is
checked where it arrives and applied between cycles, after at least one frame cycle since the previous
one: its prompt is placed as a ``prompt`` block of its own (``Reasoner.retask``), from the KV store when
the same instruction came before, and ``kv.on_instruction`` says whether the episode memory goes on
behind it (``keep``) or a new episode starts (``reset``).

With a KV store configured (``kv_store.dir``), ``~/save_memory`` (std_srvs/Trigger) and deactivate
save the episode memory; the save runs on the reasoning thread between cycles, and the service
answers once it is on disk (or with the reason it is not).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

from std_srvs.srv import Trigger

from ..config import DiagnosticsKnobs, GateKnobs, MemoryKnobs, OutputKnobs, Settings
from ..engine.vla_engine import VlaEngine
from ..kv_store import BlockStore, load_or_prefill_prompt, save_memory
from ..memory import build_policy, check_knobs
from ..runtime.action_slot import ActionSlot
from ..runtime.admission import AdmissionGate, Horizon
from ..runtime.frame_buffer import Frame, FrameBuffer
from ..runtime.instructions import Instruction, InstructionDesk
from ..runtime.loader import LoadedEngine, load_engine, reads_words
from ..runtime.reasoner import Reasoner
from ..runtime.reasoning_health import Level, ReasoningHealth, outcome_of
from .debug_image import DebugImage
from .diagnostics import ERROR, OK, WARN, DiagnosticStatus, DiagnosticsTimer, status
from .instruction_input import InstructionInput
from .managed_node import ManagedNode
from .parameters import NodeParameters

_IDLE_S = 0.0005  # how long the loop sleeps when no new frame has arrived
NODE_NAME = "reasoning"  # its services are ~/reset_episode, ~/save_memory under this name
LEVELS = {Level.OK: OK, Level.WARN: WARN, Level.ERROR: ERROR}
_SAVE_WAIT_S = 5.0  # how long ~/save_memory waits for the reasoning thread to write the block
_JOIN_S = 5.0  # how long deactivate waits for the cycle in progress to end


class ReasoningNode(ManagedNode):
    """Turns the buffer's newest frame into the slot's action while active; see the module doc."""

    def __init__(self, buffer: FrameBuffer, slot: ActionSlot, settings: Settings, **node_kwargs: Any) -> None:
        """``settings``: the whole configuration; its reasoning section declares the parameters, and configure
        loads the engine from those parameters' values (the other sections as given, so the loader can check
        that the commands fit the model's action)."""
        super().__init__(NODE_NAME, **node_kwargs)
        self.buffer = buffer
        self.slot = slot
        self._settings = settings
        self.params = NodeParameters(self, "reasoning", settings["reasoning"])
        self.params.validate_with(self._check_memory_knobs, prefix="kv.")
        self.params.on_change(self._reconfigure)
        self.health = ReasoningHealth(DiagnosticsKnobs.of(self.params.snapshot()))
        self.debug_image = DebugImage(self, self.params, OutputKnobs.of(settings["action_publisher"]))
        self.instructions = InstructionInput(self, self.params)
        # from configure to cleanup:
        self.loaded: LoadedEngine | None = None
        self.engine: VlaEngine | None = None
        self.store: BlockStore | None = None
        self.gate: AdmissionGate | None = None
        self.reasoner: Reasoner | None = None
        # what the action timeline holds, for a model of H actions a chunk (bringup hands over the publisher's);
        # None from it, or without one: the fixed deadline
        self.horizon: Callable[[int], Horizon | None] = lambda chunk_rows: None
        self._pending_lock = threading.Lock()
        self._pending_knobs: MemoryKnobs | None = None
        self._reset_requested = False
        self._reset_ns = 0  # when the last ~/reset_episode asked (monotonic ns): older frames are an old episode's
        self._save_requests: list[tuple[threading.Event, list[str]]] = []
        self._zero_counters()
        self._stop = threading.Event()  # one per activation: a thread that outlived its deactivate stays stopped
        self._thread: threading.Thread | None = None  # alive while active
        self.create_service(Trigger, "~/reset_episode", self._on_reset_episode)
        self.create_service(Trigger, "~/save_memory", self._on_save_memory)
        self._diagnostics = DiagnosticsTimer(self, self.report)

    def destroy_node(self) -> None:
        """The debug image's drawing thread ends before the node (and the publisher it draws for) goes."""
        self.debug_image.close()
        super().destroy_node()

    def _zero_counters(self) -> None:
        """Counters of one configuration (one engine, one gate): they start again at each configure."""
        self.episodes = 1
        self.memory_saves = 0
        self.cycles = 0
        self.actions = 0
        self.engine_errors = 0
        self.invalid_outputs = 0

    def action_dof(self) -> int | None:
        """The loaded model's action dimensions; None while no model is loaded."""
        return None if self.engine is None else self.engine.config.action.dof

    def _configure(self) -> None:
        settings = self._settings.replace("reasoning", self.params.snapshot())
        loaded = load_engine(settings)  # refuses an over-budget plan or a bad model before anything is built
        values = settings["reasoning"]
        self.loaded, self.engine, self.store = loaded, loaded.engine, loaded.store
        if self.store is not None:
            self.store.log = self.get_logger().warning
        self.gate = AdmissionGate.from_settings(values)
        self.reasoner = Reasoner(self.engine, self.gate)
        with self._pending_lock:  # what was asked of the previous engine does not carry over
            self._pending_knobs, self._reset_requested = None, False
        current = values["instruction"] if reads_words(settings, self.engine.checkpoint) else ""  # else token ids
        self.instructions.desk = InstructionDesk(loaded.tokenizer, values["instruction_max_tokens"], current,
                                                 time.monotonic_ns())
        self._zero_counters()
        self.get_logger().info(f"configured: {values['model_dir']} on {loaded.plan.backend}, weights "
                               f"{self.engine.checkpoint.held_as}, KV arena "
                               f"{self.engine.arena.capacity} tokens, memory policy {self.engine.policy.name}, "
                               f"prompt: {_prompt_source(current, values, loaded.tokenizer is not None)}")

    def _activate(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(self._stop,), name="reasoning", daemon=True)
        self._thread.start()

    def _deactivate(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=_JOIN_S)
        self.slot.clear()  # after the thread's last put: the publisher commands a stop, not our last answer
        if thread.is_alive():
            raise RuntimeError(f"the reasoning thread did not end its cycle within {_JOIN_S:g} s")
        if self.store is not None and self.params["kv_store.memory"]:
            _, message = self._save_memory()
            self.get_logger().info(f"deactivated: {message}")

    def _cleanup(self) -> None:
        self.instructions.desk = None
        self.loaded = self.engine = self.store = self.gate = self.reasoner = None
        gc.collect()  # the engine's weights and KV (host or device) go now, not at some later collection

    def _save_memory(self) -> tuple[bool, str]:
        """Write the episode memory to the store (reasoning thread or stopped node only): (saved, one line)."""
        try:
            written = save_memory(self.engine, self.store, self.params["kv_store.memory_name"])
        except (OSError, ValueError) as exc:
            self.get_logger().error(f"episode memory not saved: {exc}")
            return False, f"not saved: {exc}"
        self.memory_saves += 1
        return True, f"episode memory saved ({written} bytes, policy {self.engine.policy.name})"

    def _on_save_memory(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        if self.engine is None or self.store is None:
            response.success = False
            response.message = ("no model loaded: the node is unconfigured" if self.engine is None else
                                "no KV store is configured (kv_store.dir is empty)")
            return response
        done, outcome = threading.Event(), []
        if self._thread is not None:
            with self._pending_lock:
                self._save_requests.append((done, outcome))
            done.wait(_SAVE_WAIT_S)
        else:
            outcome.append(self._save_memory())
        response.success, response.message = outcome[0] if outcome else (
            False, f"the reasoning thread did not save within {_SAVE_WAIT_S:g} s")
        return response

    def _check_memory_knobs(self, values: dict[str, Any]) -> None:
        """Reject kv.* values a policy would refuse here (e.g. a protected window as large as the arena),
        whichever policy runs: it is checked against this engine's site, no policy is built. Without an
        engine, configure checks them (the loader does, against the arena it plans)."""
        engine = self.engine
        if engine is not None:
            check_knobs(MemoryKnobs.of(values), engine.memory_site())

    def _reconfigure(self, changed: dict[str, Any]) -> None:
        values = self.params.snapshot()
        if any(name in DiagnosticsKnobs.keys() for name in changed):
            self.health.configure(DiagnosticsKnobs.of(values))
        if self.gate is None:  # unconfigured: configure reads the values as they then are
            return
        if any(name in GateKnobs.keys() for name in changed):
            self.gate.configure(GateKnobs.of(values))
        if any(name.startswith("kv.") and name != "kv.policy" for name in changed):
            with self._pending_lock:
                self._pending_knobs = MemoryKnobs.of(values)

    def _on_reset_episode(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        if self.engine is None:
            response.success = False
            response.message = "no model loaded: the node is unconfigured (configure starts a new episode)"
            return response
        with self._pending_lock:
            self._reset_requested = True
            self._reset_ns = time.monotonic_ns()  # older frames, and their answers: the old episode
        self.slot.new_episode()  # now: the publisher's next tick stops, whatever the reasoning thread is doing
        response.success = True
        response.message = (f"new episode from the next cycle: prompt re-prefilled, memory policy "
                            f"{self.params['kv.policy']}")
        return response

    def _apply_pending(self) -> None:
        """Hand live memory changes to the engine; runs on the reasoning thread, between cycles."""
        with self._pending_lock:
            knobs, self._pending_knobs = self._pending_knobs, None
            reset, self._reset_requested = self._reset_requested, False
            saves, self._save_requests = self._save_requests, []
        for done, outcome in saves:  # the episode as it was, before any reset asked for with it
            outcome.append(self._save_memory())
            done.set()
        if reset:
            values = self.params.snapshot()
            if values["kv.policy"] != self.engine.policy.name:
                self.engine.set_policy(build_policy(MemoryKnobs.of(values)))
            elif self.store is not None and values["kv_store.prompt"]:
                load_or_prefill_prompt(self.engine, self.store, self.engine.prompt_ids)
            else:
                self.engine.set_prompt(self.engine.prompt_ids)
            self.episodes += 1
        if knobs is not None:
            self.engine.policy.configure(knobs)
        instruction = self.instructions.desk.take()
        if instruction is not None:
            self._retask(instruction)

    def _retask(self, instruction: Instruction) -> None:
        """Pin ``instruction``'s prompt (reasoning thread, between cycles); the current one stays if it cannot be."""
        desk, keep = self.instructions.desk, self.params["kv.on_instruction"] == "keep"
        from_store = self.store is not None and self.params["kv_store.prompt"]

        def place() -> None:
            if from_store:
                load_or_prefill_prompt(self.engine, self.store, instruction.token_ids, keep_memory=keep)
            elif keep:
                self.engine.replace_prompt(instruction.token_ids)
            else:
                self.engine.set_prompt(instruction.token_ids)

        try:
            self.reasoner.retask(place)
        except ValueError as exc:  # checked before anything moved: the engine still holds the current prompt
            desk.failed(str(exc))
            self.get_logger().warning(f"instruction not applied, the current one stays: {exc}")
            return
        now = time.monotonic_ns()
        desk.applied(instruction, now)
        self.episodes += not keep
        self.get_logger().info(f"instruction applied {(now - instruction.received_ns) / 1e6:.1f} ms after it "
                               f"arrived ({'memory kept' if keep else 'new episode'}): {instruction.text!r:.80}")

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._apply_pending()
            horizon = self.horizon(self.engine.config.action.chunk)
            if self.gate.start_at_ns(horizon) > self.gate.now_ns():  # the chunk held lasts beyond the next cycle
                time.sleep(_IDLE_S)
                continue
            frame = self.buffer.read_latest()
            if frame is None or frame.receive_ns < self._reset_ns:  # none, or the episode before's
                time.sleep(_IDLE_S)
                continue
            try:
                self._cycle(frame, stop, horizon)
            except Exception as exc:  # one bad cycle must not stop the robot's reasoning
                self.engine_errors += 1
                self.health.record("failed", time.monotonic_ns())
                self.get_logger().error(f"reasoning cycle failed, frame skipped: {exc!r}", throttle_duration_sec=5.0)

    def _cycle(self, frame: Frame, stop: threading.Event, horizon: Horizon | None) -> None:
        self.cycles += 1
        feed = self.debug_image.feed  # the debug image's references: ids and the result, never pixels
        feed.before_cycle(self.engine.policy)
        result = self.reasoner.cycle(frame, horizon)
        self.instructions.desk.cycle_done()
        self.health.record(outcome_of(result), time.monotonic_ns())
        if result.invalid:
            self.invalid_outputs += 1
            self.get_logger().error(f"no action from this frame: {result.invalid}", throttle_duration_sec=5.0)
        # not while deactivating (the slot is about to be cleared, and must stay so), nor an answer to a frame of the
        # episode before a reset (asked for while this cycle ran)
        if result.chunk is not None and not stop.is_set() and frame.receive_ns >= self._reset_ns:
            self.slot.put(result.chunk, result.ready_ns, frame.stamp_ns, frame.receive_ns)
            self.actions += 1
        feed.after_cycle(frame, result)

    def report(self) -> DiagnosticStatus:
        """This node's diagnostic status: while active, what the robot is getting over the recent window, and
        why not (``runtime/reasoning_health.py``), with ``figures()`` as its values; otherwise the state, OK,
        or ERROR with the reason after a failed transition (a configure that could not load the model)."""
        state = self.state
        if state != "active":
            doing = {"unconfigured": "no model loaded", "inactive": "model loaded, not reasoning"}.get(state, state)
            message = f"{state}: {doing}, no actions" + (f"; {self.failure}" if self.failure else "")
            return status(self, ERROR if self.failure else OK, message, self.figures())
        health = self.health.judge(time.monotonic_ns(), self.gate.snapshot())
        figures = {**self.figures(), **{f"{outcome}_share": share for outcome, share in health.shares.items()}}
        return status(self, LEVELS[health.level], health.message, figures)

    def figures(self) -> dict[str, Any]:
        """The node's state, counters and measurements as plain values (diagnostics, status line, run summary);
        only the state while no engine is loaded."""
        if self.engine is None:
            return {"state": self.state}
        stats = self.gate.snapshot()
        latency, horizon = stats.latency, stats.horizon
        memory = self.engine.memory_stats()
        return {
            "state": self.state, "cycles": self.cycles, "actions": self.actions, "refused": stats.refused, "stale": stats.stale,
            "probes": stats.kinds["cycle"].probes, "recoveries": stats.kinds["cycle"].recoveries,
            "missed": stats.missed, "invalid_outputs": self.invalid_outputs, "engine_errors": self.engine_errors,
            "latency_p50_ms": latency.p50_ms, "latency_p99_ms": latency.p99_ms,
            "cycle_predicted_ms": stats.kinds["cycle"].predicted_ms,
            "deadline": "fixed" if horizon.deadline == "fixed" else "horizon",  # the last cycle's
            "horizon_cycles": horizon.planned, "horizon_shortened": horizon.shortened,
            "horizon_empty_starts": horizon.empty, "horizon_late_starts": horizon.late,
            "horizon_left_at_start_ms": horizon.left_ms, "horizon_slack_ms": horizon.slack_ms,
            "horizon_slack_min_ms": horizon.slack_min_ms,
            "kv_policy": memory.policy, "episodes": self.episodes, "kv_tokens": memory.kv_tokens,
            "kv_capacity_tokens": self.engine.arena.capacity, "kv_bytes": memory.kv_bytes,
            "memory_state_bytes": memory.state_bytes, "frames_kept": memory.frames_kept,
            "memory_writes": memory.writes, "memory_evictions": memory.evictions,
            **self.engine.policy.diagnostics(), **self._store_report(), **self.debug_image.figures(),
            **self.instructions.desk.figures(time.monotonic_ns()),
        }

    def _store_report(self) -> dict[str, Any]:
        if self.store is None:
            return {"kv_store": "off"}
        store = self.store
        failures = ", ".join(f"{reason} {count}" for reason, count in sorted(store.failures.items())) or "none"
        return {"kv_store": str(store.directory), "kv_store_encrypted": store.encrypted,
                "kv_store_hits": store.hits, "kv_store_misses": store.misses, "kv_store_writes": store.writes,
                "kv_store_evictions": store.evictions, "kv_store_failures": failures,
                "memory_saves": self.memory_saves}


def _prompt_source(instruction: str, values: dict, has_tokenizer: bool) -> str:
    """What the pinned prompt is, for the configured log line."""
    if instruction:
        return f"instruction {instruction!r}"
    why = "" if has_tokenizer else " (the model has no tokenizer to read an instruction)"
    return f"{len(values['prompt_token_ids'])} prompt_token_ids{why}"
