"""The public calls besides the step that change state are whole or not taken under a Ctrl-C (a
``KeyboardInterrupt`` at a line event of tinn's code, as ``test_interrupted_steps``): ``update_hyperparams``
(Composite's loop over its nested optimizers, a wrapper's own keys and ``learning_rate``, Average's re-made ring),
``set_params`` and ``reset_params`` (the training and the inference weights, and a float16 model's masters)."""
import json

import numpy as np
import pytest

import tinn

from interrupts import CFG, line_events
from test_interrupted_steps import ADAM, OPTIMIZERS, points, sweep

OPTIMIZER_CASES = {
    "Composite": OPTIMIZERS["Composite"],
    "Average": {"otype": "Average", "n_samples": 3, "nested": ADAM},
    "ExponentialDecay": OPTIMIZERS["ExponentialDecay"],
}


def make(optimizer=ADAM, precision="float32"):
    return tinn.create_from_config(2, 1, {**CFG, "optimizer": optimizer}, seed=3, precision=precision)


def hyper_state(m):
    t = m.trainer
    header = json.dumps(t.hyperparams(), sort_keys=True).encode()
    return [np.frombuffer(header, np.uint8), np.array(t.optimizer.learning_rate)] + \
        [np.asarray(v) for v in t.optimizer.state_dict().values()]


def grown(value: float, factor: float) -> float:
    """``value`` times ``factor``, back down by 2^10 once above 1 (a sweep of every line event calls it often)."""
    return value * factor if value < 1 else value / 1024


def changed(config: dict) -> dict:
    """An update of every nested level of ``config`` (a trainer's optimizer hyperparameters), each value a function of
    the current one: calling it again changes the state again."""
    out = {}
    for key, value in config.items():
        if key == "learning_rate":
            out[key] = grown(value, 1.5)
        elif key in ("beta1", "decay"):
            out[key] = value * 0.99
        elif key == "n_samples":
            out[key] = value % 4 + 2
        elif key == "nested":
            out[key] = [changed(v) for v in value] if isinstance(value, list) else changed(value)
    return out


@pytest.mark.parametrize("name", list(OPTIMIZER_CASES))
def test_interrupted_update_hyperparams_is_all_or_nothing(name):
    def call(m):
        opt = m.trainer.optimizer
        update = changed(opt.hyperparams())
        update["learning_rate"] = grown(opt.learning_rate, 1.25)      # tcnn's set_learning_rate, last
        m.trainer.update_hyperparams({"optimizer": update, "loss": {}})

    a, ref, warm = make(OPTIMIZER_CASES[name]), make(OPTIMIZER_CASES[name]), make(OPTIMIZER_CASES[name])
    for m in (a, ref, warm):
        call(m)
    n_events = line_events(lambda: call(warm))
    assert n_events > 20
    sweep(a, ref, call, points(n_events, len(name)), hyper_state)


def weights_state(m):
    t = m.trainer
    return [t.params(), t.params_inference(), t.params_full_precision()]


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("what", ["set_params", "reset_params"])
def test_interrupted_set_params_is_all_or_nothing(what, precision):
    def call(m):
        p = m.network.params()
        if what == "set_params":
            m.network.set_params(p * 0.5 + 0.25)
        else:
            m.network.reset_params(int(abs(float(p.ravel()[0])) * 1e6) % 1000)      # a seed that follows the state

    a, ref, warm = make(precision=precision), make(precision=precision), make(precision=precision)
    for m in (a, ref, warm):                    # (the first call compiles and allocates)
        call(m)
    n_events = line_events(lambda: call(warm))
    sweep(a, ref, call, points(n_events, 0), weights_state)
