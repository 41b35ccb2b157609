"""Average (tcnn ``optimizers/average.h``): the mean of the last ``n_samples`` weights for inference.

Keys: ``nested`` ({} -> Adam) and ``Average.KEYS``.

After the nested step, with ``j = nested.step_counts() mod N`` (per instance, computed in the
kernel from the device counts) and a ring buffer of N weight snapshots::

    avg += (w - snap[j]) / N,    snap[j] = w

Both buffers start at zero, so for the first N steps the average is biased toward 0
(as in tcnn; before the first step inference therefore returns the output of all-zero
weights). ``avg`` is what ``inference()`` reads. Changing ``n_samples`` re-allocates
and zeroes both buffers (tcnn does so even when the value is unchanged).
State: ``weights_samples`` ``(N, K, n)``, ``weights_average`` plus ``nested.*``.
"""
import taichi as ti

from ..keys import INT32_MAX, POSITIVE_INT, Key
from ..params import Buffer
from ..registry import optimizers
from ..runtime.kernels import ARENA, arena_kernel
from .optimizer import F32_3D, I32_1D, zeros
from .wrapper import Wrapper


@arena_kernel
def _average_step(avg: ARENA, ao: ti.i32, W: ARENA, wo: ti.i32, n: ti.i32, snap: F32_3D,
                  active: I32_1D, steps: I32_1D, n_samples: ti.i32):
    for k, i in ti.ndrange(active.shape[0], n):
        if active[k]:
            j = steps[k] % n_samples
            w = W[k, wo + i]
            avg[k, ao + i] = avg[k, ao + i] + (w - snap[j, k, i]) / ti.cast(n_samples, ti.f32)
            snap[j, k, i] = w


@optimizers.register("Average")
class Average(Wrapper):
    otype = "Average"
    KEYS = {"n_samples": Key(128, POSITIVE_INT, "number of weight snapshots averaged")}
    STATE = ("weights_samples", "weights_average")

    def create_state(self):
        self.weights_samples = zeros(self._ring_shape(self.hparams["n_samples"]), ti.f32)
        self.weights_average = Buffer(self.n_instances, self.n_params, "Average weights")

    def _ring_shape(self, n_samples: int) -> tuple:
        """``(n_samples, K, n)``; refused before allocating when it exceeds what one array can address."""
        size = n_samples * self.n_instances * self.n_params
        if size > INT32_MAX:
            raise ValueError(f"optimizer 'Average': key 'n_samples' = {n_samples} keeps {n_samples} x "
                             f"{self.n_instances} x {self.n_params} = {size} floats of snapshots, more than the "
                             f"{INT32_MAX} one array can hold")
        return n_samples, self.n_instances, self.n_params

    def _validated(self, changes):
        values = super()._validated(changes)
        if self.slot is not None and self.n_params:
            self._ring_shape(values["n_samples"])          # refused before anything (nested included) changes
        return values

    def _set_hparams(self, values):
        """(A phase of an update that can run again: the ring's own size says whether it must be re-made.)"""
        resize = self.slot is not None and self.n_params and values["n_samples"] != self.weights_samples.shape[0]
        super()._set_hparams(values)
        if resize:
            self.create_state()

    def after_nested(self, step):
        if self.n_params:
            s, avg = self.slot, self.weights_average
            _average_step(avg.field, avg.offset, s.params, s.p_off, s.n, self.weights_samples, step.mask,
                          self.nested.steps_array(), self.hparams["n_samples"])

    def inference_weights(self):
        return (self.weights_average.field, self.weights_average.offset) if self.n_params else None
