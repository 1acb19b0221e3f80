"""The action publisher node: the robot's command at a fixed rate, fresh or a safe stop, never nothing.

Reasoning hands its newest chunk of actions over through an ActionSlot and may go quiet at any time
(refused cycles, a slow model, a crash); this node keeps the command topic going at ``control_rate_hz``
regardless. Each tick the action timeline (``runtime/action_timeline.py``) takes in a chunk it has not
seen (checked first: ``runtime/chunk_safety.py``), picks the tick's action under ``execution`` (sync,
chunk, ensemble, rtc), and ActionOutput decides between the clipped action and a safe stop. The
control timer runs on the steady clock, like the slot's timestamps: a paused or missing /clock under
``use_sim_time`` must not stop the watchdog. Message stamps come from the node clock, so they follow
sim time when it is used.

A managed node (``managed_node.py``), because a robot must never be driven by a node that is not
active: configure builds the command mapping and a lifecycle publisher on ``command_topic``, activate
starts the control timer, deactivate stops it and sends one explicit stop (the safe stop of the
command type), after which the node publishes nothing until it is activated again; cleanup waits up
to ACK_WAIT_S for reliable subscribers to acknowledge what was sent, then removes the publisher. The
publisher is a lifecycle publisher, so even a stray call could not command the robot while inactive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import Twist
from rclpy.clock import Clock, ClockType
from rclpy.duration import Duration
from rclpy.lifecycle import LifecyclePublisher
from rclpy.timer import Timer
from std_msgs.msg import Float32MultiArray, MultiArrayDimension
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from ..config import OutputKnobs
from ..runtime.action_output import ActionOutput, Command, Outcome, check_fits_action
from ..runtime.action_slot import ActionSlot
from ..runtime.action_timeline import ActionTimeline
from ..runtime.admission import Horizon
from ..runtime.event_window import EventWindow
from .diagnostics import ERROR, OK, WARN, DiagnosticsTimer, status
from .managed_node import ManagedNode
from .parameters import NodeParameters

RATE_WINDOW_S = 2.0  # the control timer's achieved rate is measured over this window
RATE_WARN_SHARE = 0.9  # diagnostics WARN below this share of control_rate_hz
MESSAGE_TYPES = {"twist": Twist, "float32_multi_array": Float32MultiArray, "joint_trajectory": JointTrajectory}
ACK_WAIT_S = 1.0  # cleanup waits this long at most for reliable subscribers to acknowledge the last commands


class ActionPublisher(ManagedNode):
    """Publishes the command of ``slot``'s newest action on ``command_topic`` while active; see the module doc."""

    def __init__(self, slot: ActionSlot, settings: dict[str, Any], *, dof: Callable[[], int | None] | None = None,
                 **node_kwargs: Any) -> None:
        """``dof``: the dimensions of the action the slot will hold (the engine's; None while no engine is
        loaded), so limits and mappings are checked against it at configure and on every change; None when
        the node runs without knowing its engine."""
        super().__init__("action_publisher", **node_kwargs)
        self._slot = slot
        self._episode = slot.episode  # the slot's episode the timeline holds chunks of
        self._dof = dof
        self._params = NodeParameters(self, "action_publisher", settings)
        self._knobs = OutputKnobs.of(self._params.snapshot())  # replaced whole on a live change
        self._timeline: ActionTimeline | None = None  # from configure to cleanup
        self._publisher: LifecyclePublisher | None = None
        self._counts = {"published": 0, "fresh": 0, "safe_stops": 0, "stale": 0, "no_action": 0, "starved": 0,
                        "config_errors": 0, "invalid_actions": 0, "shutdown_stops": 0}
        self._last: Command | None = None  # the previous tick's decision
        self._ticks = EventWindow(RATE_WINDOW_S)  # the control timer's achieved rate, and chunks rejected lately
        self._last_timeout_ms = self._knobs.action_timeout_ms
        self._diagnostics = DiagnosticsTimer(self, self.report)

        self._steady = Clock(clock_type=ClockType.STEADY_TIME)
        self._timer_lock = threading.Lock()
        self._timer: Timer | None = None  # exists only while active
        self._params.validate_with(self._check_output)
        self._params.on_change(self._on_change)

    def _action_dof(self) -> int | None:
        return None if self._dof is None else self._dof()

    def _configure(self) -> None:
        knobs = OutputKnobs.of(self._params.snapshot())
        self._timeline = ActionTimeline(ActionOutput(knobs, self._action_dof()))
        self._knobs = knobs
        self._publisher = self.create_lifecycle_publisher(MESSAGE_TYPES[knobs.command_type],
                                                          self._params["command_topic"], 10)

    def _activate(self) -> None:
        self._ticks = EventWindow(RATE_WINDOW_S)
        self._timeline.reset()  # no chunk from before: the first tick commands what reasoning hands over now
        self._episode = self._slot.episode
        self._last = None  # the first tick's decision is logged, whatever the last one before was
        self._start_timer()
        self.get_logger().info(f"active: commanding {self._publisher.topic_name} at "
                               f"{self._params['control_rate_hz']:g} Hz")

    def _deactivate(self) -> None:
        with self._timer_lock:
            timer, self._timer = self._timer, None
        if timer is None:  # not commanding: there is nothing to stop
            return
        self.destroy_timer(timer)
        command = self._timeline.stop()
        if command.values is None:  # a trajectory robot that was never commanded: nothing to hold
            self.get_logger().info("deactivated: no joint positions were ever commanded, no stop to send")
            return
        self._publisher.publish(self._message(command.values))
        self._counts["published"] += 1
        self._count(command)
        self._last = command
        self.get_logger().info(f"deactivated: sent an explicit stop ({self._timeline.output.command_type}); no "
                               "commands until activated")

    def _cleanup(self) -> None:
        if self._publisher is not None:  # a base without its own command timeout must get that stop
            self._publisher.wait_for_all_acked(Duration(nanoseconds=int(ACK_WAIT_S * 1e9)))
            self.destroy_lifecycle_publisher(self._publisher)
        self._publisher = self._timeline = None

    def _start_timer(self) -> None:
        """(Re)create the control timer at the current control_rate_hz."""
        with self._timer_lock:
            if self._timer is not None:
                self.destroy_timer(self._timer)
            self._timer = self.create_timer(1.0 / self._params["control_rate_hz"], self._tick, clock=self._steady)

    def _check_output(self, values: dict[str, Any]) -> None:
        """Refuse a change the command knobs cannot take together (min above max) or with this action."""
        knobs = OutputKnobs.of(values)
        dof = self._action_dof()
        if dof is not None:
            check_fits_action(knobs, dof)

    def _on_change(self, changed: dict[str, Any]) -> None:
        self._knobs = OutputKnobs.of(self._params.snapshot())  # read whole by the next tick
        if "control_rate_hz" in changed and self._timer is not None:
            self._ticks = EventWindow(RATE_WINDOW_S)
            self._start_timer()
            self.get_logger().info(f"control rate now {changed['control_rate_hz']:g} Hz")

    def _tick(self) -> None:
        now = time.monotonic_ns()
        self._ticks.add("tick", now)
        knobs, timeline = self._knobs, self._timeline
        timeout_ms = knobs.action_timeout_ms
        rejected = sum(timeline.rejected.values())
        if self._slot.episode != self._episode:  # a new episode (``ActionSlot.new_episode``): nothing held from before
            self._episode = self._slot.episode
            timeline.reset()
        command = timeline.command(self._slot.latest(), now, knobs, round(1e9 / self._params["control_rate_hz"]))
        if sum(timeline.rejected.values()) > rejected:
            self._ticks.add("rejected", now)
            self.get_logger().warning(f"chunk rejected, {timeline.last_rejection}", throttle_duration_sec=1.0)
        if command.values is not None:
            self._publisher.publish(self._message(command.values))
            self._counts["published"] += 1
        self._count(command)
        self._log_change(command, timeout_ms)
        self._last, self._last_timeout_ms = command, timeout_ms

    def horizon(self, chunk_rows: int) -> Horizon | None:
        """What the reasoning node's gate plans a model of ``chunk_rows`` actions a chunk on (called from the
        reasoning thread): the timeline's horizon with the slot's newest chunk; None while not commanding (nothing
        runs out) or when execution is sync (the fixed deadline)."""
        timeline = self._timeline
        if timeline is None or self._timer is None:
            return None
        return timeline.horizon(self._slot.latest(), chunk_rows, self._knobs,
                                round(1e9 / self._params["control_rate_hz"]))

    def _message(self, values: tuple[float, ...]) -> Twist | Float32MultiArray | JointTrajectory:
        kind = self._timeline.output.command_type
        if kind == "twist":
            msg = Twist()
            (msg.linear.x, msg.linear.y, msg.linear.z, msg.angular.x, msg.angular.y, msg.angular.z) = values
            return msg
        if kind == "float32_multi_array":
            msg = Float32MultiArray(data=list(values))
            msg.layout.dim = [MultiArrayDimension(label="action", size=len(values), stride=len(values))]
            return msg
        msg = JointTrajectory(joint_names=list(self._params["joint_names"]))
        msg.header.stamp = self.get_clock().now().to_msg()
        period_ns = int(1e9 / self._params["control_rate_hz"])
        msg.points = [JointTrajectoryPoint(positions=list(values),
                                           time_from_start=Duration(nanoseconds=period_ns).to_msg())]
        return msg

    def _count(self, command: Command) -> None:
        key = {Outcome.FRESH: "fresh", Outcome.STALE: "stale", Outcome.NONE: "no_action",
               Outcome.STARVED: "starved", Outcome.CONFIG_ERROR: "config_errors",
               Outcome.INVALID: "invalid_actions", Outcome.SHUTDOWN: "shutdown_stops"}[command.outcome]
        self._counts[key] += 1
        if command.safe_stop:
            self._counts["safe_stops"] += 1

    def _log_change(self, command: Command, timeout_ms: float) -> None:
        """One log line when the kind of command changes, not one per tick."""
        if self._last is not None and (command.outcome, command.error) == (self._last.outcome, self._last.error):
            return
        logger = self.get_logger()
        if command.outcome is Outcome.FRESH:
            logger.info("commanding fresh actions")
        elif command.outcome is Outcome.CONFIG_ERROR:
            logger.error(f"safe stop: {self._reason(command, timeout_ms)}")
        else:
            logger.warning(f"safe stop: {self._reason(command, timeout_ms)}")

    @staticmethod
    def _reason(command: Command, timeout_ms: float) -> str:
        if command.outcome is Outcome.STALE:
            return f"action is {command.age_ms:.1f} ms old (timeout {timeout_ms:g} ms)"
        if command.outcome is Outcome.NONE:
            return "no action from reasoning (none yet, or reasoning is not active)"
        if command.outcome is Outcome.STARVED:
            return "starved: every chunk of actions has run out (the next one came too late, or was rejected)"
        if command.outcome is Outcome.CONFIG_ERROR:
            return f"configuration error: {command.error}"
        return command.error or command.outcome.value

    def report(self, now_ns: int | None = None) -> DiagnosticStatus:
        """While active: ERROR while the robot gets safe stops (starved included); WARN when the control timer runs
        below RATE_WARN_SHARE of control_rate_hz (the robot then gets commands less often than configured), or when
        a chunk was rejected in the last RATE_WINDOW_S (the robot runs on an older one, or stops); else OK.
        In any other state the robot gets no commands from this node, and the status says so: OK, or ERROR
        with the reason after a failed transition."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        figures = self.figures(now)
        if self.state != "active":
            message = f"{self.state}: publishing no commands" + (f"; {self.failure}" if self.failure else "")
            return status(self, ERROR if self.failure else OK, message, figures)
        command = self._last or Command(Outcome.NONE, None, None)
        problems, level = [], OK
        if command.safe_stop:
            level = ERROR
            problems.append(f"safe stop: {self._reason(command, self._last_timeout_ms)}")
        wanted = self._params["control_rate_hz"]
        if self._ticks.covered_s(now) >= RATE_WINDOW_S / 2 and figures["achieved_rate_hz"] < RATE_WARN_SHARE * wanted:
            level = max(level, WARN)
            problems.append(f"publishing at {figures['achieved_rate_hz']:.1f} Hz, below {RATE_WARN_SHARE:.0%} of "
                            f"control_rate_hz {wanted:g} Hz")
        rejected = self._ticks.counts(now)["rejected"]
        if rejected:
            level = max(level, WARN)
            problems.append(f"{rejected} chunk{'s' if rejected > 1 else ''} rejected in the last {RATE_WINDOW_S:g} s "
                            f"(latest: {self._timeline.last_rejection})")
        return status(self, level, "; ".join(problems) or "commanding fresh actions", figures)

    def figures(self, now_ns: int | None = None) -> dict[str, object]:
        """The node's state and counters as plain values: what was published, and why each tick was what it was."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        command = self._last or Command(Outcome.NONE, None, None)
        timeline = {} if self._timeline is None else self._timeline.figures(now_ns, self._knobs)
        return {"state": self.state, **self._counts,
                "last_action_age_ms": "none" if command.age_ms is None else float(command.age_ms),
                "command_type": self._knobs.command_type, "achieved_rate_hz": self._ticks.rate_hz("tick", now_ns),
                **timeline}
