"""Small models for the reliability tests, their state, and Ctrl-C injected at a chosen line of tinn's code."""
import os
import sys

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


class Interrupt:
    """Counts the line events in tinn's code during a call, or raises ``KeyboardInterrupt`` at the ``at``-th."""

    def __init__(self, at=None):
        self.at, self.events = at, 0

    def _line(self, frame, event, arg):
        if event == "line":
            self.events += 1
            if self.events == self.at:
                raise KeyboardInterrupt
        return self._line

    def _call(self, frame, event, arg):
        if frame.f_code.co_filename.startswith(TINN_DIR):
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
