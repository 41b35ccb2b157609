"""A commit point: calls that change state run whole or, if the first is interrupted, not at all
(:func:`commit`). An optimizer step, a float16 step's loss-scale record and publish, a parameter write: each is
a list of phases, calls that each change state all at once (one kernel launch, their last line) or can run again
(a copy). Once one has run, an interrupt (or any exception) no longer stops the list: the remaining phases run,
then the exception is raised. A real SIGINT (Ctrl-C) on the main thread, while Python's default handler is
installed, is held until the phases have run."""
import _signal                  # signal.signal and signal.getsignal without their enum conversion (~20 us a step)
import threading


def commit(phases):
    """Run ``phases`` (zero-argument calls, module docstring) as one step: all or, if the first is interrupted, none.

    A ``KeyboardInterrupt`` from a real SIGINT waits until the phases have run (on the main thread, while Python's
    default handler is installed); any exception raised in a phase after the first has run is raised after the
    remaining phases ran."""
    deferred = _defer_sigint()
    done = 0
    try:
        while done < len(phases):
            phases[done](); done += 1                   # noqa: E702 (one line: no interrupt between the two)
    except BaseException:
        while 0 < done < len(phases):
            phases[done](); done += 1                   # noqa: E702
        raise
    finally:
        _resume_sigint(deferred)


_pending = []                   # SIGINTs that arrived during a commit


def _hold(signum, frame):
    _pending.append(signum)


def _defer_sigint() -> bool:
    """Hold SIGINT back (``True``) if this is the main thread and Python's default handler is installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if _signal.getsignal(_signal.SIGINT) not in (_signal.default_int_handler, _hold):
        return False                                    # the user's own handler
    _signal.signal(_signal.SIGINT, _hold)
    return True


def _resume_sigint(deferred: bool):
    """Put the default handler back; a SIGINT held meanwhile raises ``KeyboardInterrupt`` now."""
    if deferred:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        if _pending:
            _pending.clear()
            raise KeyboardInterrupt
