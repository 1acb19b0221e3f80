"""The stop-signal handler: an interruption during start-up is one line and exit 2, whatever a library
between the signal and the entry point made of it (CI once saw rclpy's C-extension loader turn it into an
ImportError, and the process died with a traceback)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from vla_edge_ros.runtime.stop_signals import StopSignals, run_until_interrupted


def _signal_inside(library_reaction: str):
    def body(stop: StopSignals) -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered before kill returns: the handler raises here
            signal.pause()  # not reached unless the handler failed to raise
        except BaseException as exc:
            if library_reaction == "wraps":
                raise ImportError("initialization failed") from exc
            if library_reaction == "replaces":
                raise RuntimeError("the loader gave up")  # no chain at all
            raise
        return 0

    return body


@pytest.mark.parametrize("library_reaction", ["passes through", "wraps", "replaces"])
def test_an_interruption_is_one_line_and_exit_2_however_a_library_reraises_it(capsys, library_reaction):
    before = signal.getsignal(signal.SIGTERM)
    assert run_until_interrupted("prog", _signal_inside(library_reaction)) == 2
    assert capsys.readouterr().err == "prog: interrupted by SIGTERM during start-up\n"
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back


def test_an_interruption_an_optional_import_swallowed_still_ends_the_start_up(capsys):
    """``try: import fast_thing except ImportError: use the slow one``: the interruption, turned into an
    ImportError by a C loader, is taken for a missing module and start-up goes on; it must end before the
    loop runs, not 120 s later when the run's duration is up."""
    def body(stop: StopSignals) -> int:
        try:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                signal.pause()
            except BaseException as exc:
                raise ImportError("initialization failed") from exc
        except ImportError:
            pass  # the fallback
        stop.running = True
        return 0

    assert run_until_interrupted("prog", body) == 2
    assert capsys.readouterr().err == "prog: interrupted by SIGTERM during start-up\n"


def test_an_error_without_a_signal_is_not_taken_for_an_interruption():
    def body(stop: StopSignals) -> int:
        raise ImportError("a genuinely missing library")

    with pytest.raises(ImportError, match="genuinely missing"):
        run_until_interrupted("prog", body)


def test_a_signal_while_running_only_asks_the_loop_to_stop():
    def body(stop: StopSignals) -> int:
        stop.running = True
        os.kill(os.getpid(), signal.SIGINT)
        return 0 if stop.requested == "SIGINT" else 1

    assert run_until_interrupted("prog", body) == 0


def test_the_same_signal_again_while_stopping_is_the_same_request_and_another_is_an_escalation(capsys):
    """Ctrl-C reaches every process of a terminal's foreground group, and the launch file forwards it to
    bringup as well: the second SIGINT must not cut short the stop the first one started (the robot's explicit
    stop, the memory save, exit 0). A SIGTERM then (launch's escalation after its sigterm_timeout) does."""
    def body(stop: StopSignals) -> int:
        stop.running = True
        os.kill(os.getpid(), signal.SIGINT)  # the terminal's
        stop.running = False  # the loop saw it and returned: stopping
        os.kill(os.getpid(), signal.SIGINT)  # launch's copy of the same Ctrl-C
        stopped_in_full = stop.requested == "SIGINT"
        os.kill(os.getpid(), signal.SIGTERM)  # escalation: stop now
        return 0 if stopped_in_full else 1

    assert run_until_interrupted("prog", body) == 2
    assert capsys.readouterr().err == "prog: interrupted by SIGTERM while stopping\n"


def test_a_second_sigint_handled_inside_the_first_handler_is_the_same_request():
    """Both SIGINTs of a Ctrl-C under launch arrive together, and Python may run the second's handler between
    two lines of the first's. Whichever line it lands on, the first must not take the second's request for an
    escalation (it did: 'interrupted by SIGINT while stopping', exit 2, in a launch test)."""
    lines = []

    def trace(frame, event, arg):
        if frame.f_code is StopSignals.__call__.__code__ and event == "line":
            lines.append(frame.f_lineno)
        return trace

    stop = StopSignals()
    stop.running = True
    sys.settrace(trace)
    try:
        stop(signal.SIGINT, None)
    finally:
        sys.settrace(None)
    for nested_after in sorted(set(lines)):  # the second handler run just before each line of the first
        stop = StopSignals()
        stop.running = True

        def nested(frame, event, arg, stop=stop, at=nested_after, done=[]):
            if frame.f_code is StopSignals.__call__.__code__ and event == "line" and frame.f_lineno == at and not done:
                done.append(True)
                sys.settrace(None)
                stop(signal.SIGINT, None)  # the second delivery, handled inside the first
                sys.settrace(nested)
            return nested

        sys.settrace(nested)
        try:
            stop(signal.SIGINT, None)
        finally:
            sys.settrace(None)
        assert stop.requested == "SIGINT" and stop.interruption is None, nested_after
