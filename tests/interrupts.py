"""Small models for the reliability tests, their state, and Ctrl-C injected at a chosen line of tinn's code."""
import os
import sys
import weakref

import numpy as np

import tinn

TINN_DIR = os.path.dirname(tinn.__file__)
CFG = {"encoding": {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 8,
                    "base_resolution": 4},
       "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1},
       "loss": {"otype": "L2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2}}


def model(seed=3, cfg=CFG):
    return tinn.create_from_config(2, 1, cfg, seed=seed)


def batch(n=64, seed=0):
    r = np.random.default_rng(seed)
    return r.random((n, 2), dtype=np.float32), r.random((n, 1), dtype=np.float32)


def weights(m):
    return np.concatenate([m.trainer.params().ravel(), m.trainer.params_inference().ravel()])


def full_state(m):
    return [weights(m)] + [np.asarray(v) for v in m.trainer.optimizer.state_dict().values()]


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(p, q) for p, q in zip(a, b))


def _in_finalizer(frame) -> bool:
    """Whether the frame runs for the garbage collector (a ``__del__`` or a ``weakref.finalize`` callback): where
    and whether that happens during a call is the collector's choice, and Python swallows an exception raised
    there ("Exception ignored in ..."), so those lines are not lines of the call."""
    while frame is not None:
        if frame.f_code.co_name == "__del__" or frame.f_code.co_filename == weakref.__file__:
            return True
        frame = frame.f_back
    return False


class Interrupt:
    """Counts the line events in tinn's code during a call, or raises ``KeyboardInterrupt`` at the ``at``-th
    (lines run for the garbage collector are neither counted nor interrupted)."""

    def __init__(self, at=None):
        self.at, self.events = at, 0

    def _line(self, frame, event, arg):
        if event == "line":
            self.events += 1
            if self.events == self.at:
                raise KeyboardInterrupt
        return self._line

    def _call(self, frame, event, arg):
        if frame.f_code.co_filename.startswith(TINN_DIR) and not _in_finalizer(frame):
            return self._line
        return None

    def run(self, call) -> bool:
        """Whether the call was interrupted."""
        sys.settrace(self._call)
        try:
            call()
            return False
        except KeyboardInterrupt:
            return True
        finally:
            sys.settrace(None)


def line_events(call) -> int:
    counter = Interrupt()
    counter.run(call)
    return counter.events
