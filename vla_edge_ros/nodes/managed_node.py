"""A managed (lifecycle) node whose transitions fail with a reason: never silently, never fatally.

States and transitions are ROS 2's own (design.ros2.org/articles/node_lifecycle.html): unconfigured
-configure-> inactive -activate-> active -deactivate-> inactive -cleanup-> unconfigured, and shutdown
from each of them to finalized. A subclass does each transition's work in a hook (``_configure``,
``_activate``, ``_deactivate``, ``_cleanup``) that raises when it cannot, and this class adds what
rclpy's LifecycleNode leaves out:

- A hook that raises turns the transition into ERROR, so the node passes through error processing,
  where ``_deactivate`` and ``_cleanup`` bring it back to unconfigured (a robot is never left half
  configured). rclpy maps the exception to ERROR without a word (Humble), so the reason is logged
  here on one line and kept in ``failure`` until a transition succeeds; diagnostics show it, since a
  ChangeState answer carries nothing but ``success``. Both hooks must therefore work from any state
  a failed transition leaves behind.
- A ChangeState request for a transition the current state does not offer is answered
  ``success = false`` with a log line naming the state and what it offers. On Humble, rclpy raises
  out of the service callback instead when the request names the transition by id, which ends the
  executor's spin, and with it the process.
- In-process callers (the bringup, `vla-edge run`, tests) use ``transition(label)``, which raises
  TransitionError with the reason; the caller reports it, so the node does not log it twice.

The private parts of rclpy used here (``_state_machine``, ``_service_change_state`` and a service's
``callback``) are the same from Humble to Kilted.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

from lifecycle_msgs.srv import ChangeState
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

from ..config import USER_ERRORS

SUCCESS, ERROR, FAILURE = (TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.ERROR,
                           TransitionCallbackReturn.FAILURE)


class TransitionError(ValueError):
    """A transition that did not happen; the message is the reason, ready for one line on stderr."""


class ManagedNode(LifecycleNode):
    """A LifecycleNode with reasons for failed transitions and a ChangeState that never raises; see the module doc."""

    def __init__(self, node_name: str, **node_kwargs) -> None:
        super().__init__(node_name, **node_kwargs)
        self.failure: str | None = None  # "<transition> failed: <reason>", until a transition succeeds
        self._failure_reason: str | None = None  # the bare reason, for TransitionError
        self._caller_reports = False  # an in-process transition: the caller reports a failure
        answer = self._service_change_state.callback
        self._service_change_state.callback = lambda request, response: self._change_state(answer, request, response)

    @property
    def state(self) -> str:
        """The current state's label: unconfigured, inactive, active or finalized."""
        return self._state_machine.current_state[1]

    def offered(self) -> list[str]:
        """The labels of the transitions the current state offers."""
        return sorted({transition[1] for transition in self._state_machine.available_transitions})

    def _offers(self) -> str:
        return f"{self.get_fully_qualified_name()} is {self.state} and offers {', '.join(self.offered()) or 'nothing'}"

    def transition(self, label: str) -> None:
        """Run transition ``label`` (configure, activate, deactivate, cleanup, shutdown) here and now; raise
        TransitionError with the reason when the state does not offer it or it fails."""
        if label not in self.offered():
            raise TransitionError(f"{self._offers()}, not {label}")
        self._caller_reports = True
        try:
            result = getattr(self, f"trigger_{label}")()
        finally:
            self._caller_reports = False
        if result != SUCCESS:
            raise TransitionError(self._failure_reason or f"{self.get_fully_qualified_name()}: {label} failed")

    def _change_state(self, answer: Callable, request: ChangeState.Request,
                      response: ChangeState.Response) -> ChangeState.Response:
        available = self._state_machine.available_transitions
        wanted = request.transition.label or request.transition.id
        if wanted not in {t[1] for t in available} | {t[0] for t in available}:
            self.get_logger().warning(f"refused transition {wanted!r}: {self._offers()}")
            response.success = False
            return response
        return answer(request, response)

    # rclpy's transition callbacks ------------------------------------------------------------------

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._run("configure", self._configure)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        result = super().on_activate(state)  # enables lifecycle publishers before the first command
        return result if result != SUCCESS else self._run("activate", self._activate)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        result = self._run("deactivate", self._deactivate)  # the last command goes out first ...
        return result if result != SUCCESS else super().on_deactivate(state)  # ... then publishers go quiet

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._run("cleanup", self._cleanup)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        if state.label == "active":
            result = self.on_deactivate(state)
            if result != SUCCESS:
                return result
        return self._run("shutdown", self._cleanup) if state.label in ("active", "inactive") else SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Back to unconfigured from whatever the failed transition left; finalized if even that fails."""
        try:
            self._deactivate()
            super().on_deactivate(state)
            self._cleanup()
        except Exception as exc:  # reported: a node that cannot be released is not trusted again
            self.get_logger().error(f"error processing could not release the node, finalizing it: {exc!r}")
            return FAILURE
        return SUCCESS

    def _run(self, transition: str, work: Callable[[], None]) -> TransitionCallbackReturn:
        try:
            work()
        except Exception as exc:  # a failed transition, not a dead process
            self._failure_reason = str(exc) if isinstance(exc, USER_ERRORS) else f"{type(exc).__name__}: {exc}"
            self.failure = f"{transition} failed: {self._failure_reason}"
            if not isinstance(exc, USER_ERRORS):  # a bug: show where
                self.get_logger().error(f"{self.failure}\n{traceback.format_exc().rstrip()}")
            elif not self._caller_reports:
                self.get_logger().error(self.failure)
            return ERROR
        self.failure = self._failure_reason = None
        return SUCCESS

    # the subclass's work -----------------------------------------------------------------------------

    def _configure(self) -> None:
        """Load and check what the node needs; raise with the reason when it cannot."""
        raise NotImplementedError

    def _activate(self) -> None:
        """Start acting."""
        raise NotImplementedError

    def _deactivate(self) -> None:
        """Stop acting; does nothing when the node is not acting (error processing calls it from any state)."""
        raise NotImplementedError

    def _cleanup(self) -> None:
        """Free what configure built; what was never built is skipped (error processing calls it too)."""
        raise NotImplementedError
