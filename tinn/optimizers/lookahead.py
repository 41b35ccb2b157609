"""Lookahead (tcnn ``optimizers/lookahead.h``; Zhang et al. 2019).

Keys: ``nested`` ({} -> Adam) and ``Lookahead.KEYS``.

Before each nested step, with ``s = nested.step_counts()`` (per instance)::

    if s == 0:             slow = w
    if s mod n_steps == 0: w = (1 - alpha) slow + alpha w;  slow = w

then the nested step runs (both tests in the kernel, on the device counts). ``inference()`` reads
the slow weights. They start as a
copy of the weights (tcnn leaves them uninitialised until the first step).
State: ``weights_lookahead`` plus ``nested.*``.
"""
import taichi as ti

from ..keys import CLOSED_UNIT, POSITIVE_INT, Key
from ..params import Buffer
from ..registry import optimizers
from ..runtime.kernels import ARENA, arena_kernel, copy_columns
from .optimizer import I32_1D
from .step import count_skipped, gate, gate_args
from .wrapper import Wrapper


@arena_kernel
def _lookahead_step(slow: ARENA, so: ti.i32, W: ARENA, wo: ti.i32, n: ti.i32, active: I32_1D,
                    steps: I32_1D, n_steps: ti.i32, alpha: ti.f32, source: I32_1D, G: ARENA, go: ti.i32,
                    gn: ti.i32, skipped: I32_1D, inv_scale: ti.f32):
    """The step's first kernel: its gate (``step.py``), then the synchronisation of the ``active`` networks."""
    gate(source, G, 0, go, gn, inv_scale, active)
    for k, i in ti.ndrange(active.shape[0], n):
        on, s = active[k] != 0, steps[k]
        if on and s == 0:
            slow[k, so + i] = W[k, wo + i]
        if on and s % n_steps == 0:
            w = slow[k, so + i] * (1.0 - alpha) + W[k, wo + i] * alpha
            W[k, wo + i] = w
            slow[k, so + i] = w
    for k in range(active.shape[0]):
        count_skipped(source, active, skipped, k)


@optimizers.register("Lookahead")
class Lookahead(Wrapper):
    otype = "Lookahead"
    KEYS = {"alpha": Key(0.5, CLOSED_UNIT, "how far the slow weights move toward the fast ones"),
            "n_steps": Key(16, POSITIVE_INT, "fast steps between synchronisations")}
    STATE = ("weights_lookahead",)

    def create_state(self):
        self.weights_lookahead = slow = Buffer(self.n_instances, self.n_params, "Lookahead weights")
        copy_columns(slow.field, slow.offset, self.slot.params, self.slot.p_off, self.n_params,
                     self.all_networks())

    def gates_before(self) -> bool:
        return bool(self.n_params)

    def before_nested(self, step):
        if self.n_params:
            slow, s, h = self.weights_lookahead, self.slot, self.hparams
            _lookahead_step(slow.field, slow.offset, s.params, s.p_off, s.n, step.mask, self.nested.steps_array(),
                            h["n_steps"], h["alpha"], *gate_args(step, s.grads, self._skipped), 1.0 / step.loss_scale)

    def inference_weights(self):
        return (self.weights_lookahead.field, self.weights_lookahead.offset) if self.n_params else None
