"""Half-precision training, as tcnn's ``TCNN_HALF_PRECISION`` build and Dr.Jit's ``GradScaler``: float16
parameters in the model, float32 master weights for the optimizer, a dynamic loss scale.

A model built with ``precision="float16"`` stores its parameters and inference weights (what it reads) as
float16, and its gradients as float32 (``tinn.params.ParamStore``): every kernel reads the float16 weights,
computes in float32 and adds its partial sums into the float32 gradients. A gradient is the sum of many
partial sums (per block and per sample on a GPU, added with atomics): a float16 accumulator would round the
later ones away, or lose them entirely once the sum is large. An MLP keeps its hidden activations in float16
(``tinn.params.KEPT_ACTIVATIONS``). Its :class:`~tinn.trainer.Trainer` then keeps

* :class:`MasterWeights`: a float32 store of the same layout, which the optimizer is bound to (its
  moments and averaged weights are float32 too). After the backward pass the model's gradients are copied
  into it (checking them for overflow); after an optimizer step its weights are rounded back into the
  model's float16 parameters and inference weights (tcnn's ``optimizer.step(ls, fp32, params, grads)``).
* :class:`LossScale`: the loss multiplies its gradients by ``scale`` and the optimizer divides by it, so
  that small gradients survive float16 (smallest normal 6.1e-5). As in tcnn, a step overflows when a scaled
  gradient lies beyond float16's range (``|scale * dL/dθ| > 65504``) or is not finite: it is skipped (no
  parameter and no optimizer state changes) and the scale halves. After ``growth_interval`` good steps in a
  row it doubles.

The scale starts at tcnn's 128 and stays within ``[2^-24, 2^24]``. Deciding whether to skip reads one flag
back from the device per step (the float32 path reads nothing).
"""

import numpy as np
import taichi as ti

from .batch.buffers import buffer
from .params import FLOAT16_MAX, ParamStore
from .runtime.kernels import columns_per_task, copy_columns


class LossScale:
    """A dynamic loss scale: ``update(overflow)`` after each backward pass says whether to step.

    ``overflow`` -> skip the step, ``scale *= backoff_factor``, restart the count of good steps;
    ``growth_interval`` good steps in a row -> ``scale *= growth_factor``.
    """

    MIN, MAX = 2.0 ** -24, 2.0 ** 24

    def __init__(self, scale: float = 128.0, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 1000):
        if not (growth_factor > 1 and 0 < backoff_factor < 1 and int(growth_interval) >= 1
                and self.MIN <= scale <= self.MAX):
            raise ValueError(f"LossScale needs growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1 and "
                             f"a scale in [2^-24, 2^24], got {growth_factor}, {backoff_factor}, {growth_interval}, "
                             f"{scale}")
        self.scale, self.growth_factor, self.backoff_factor = float(scale), float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.good_steps = 0          # good steps since the scale last changed
        self.skipped = 0             # steps skipped so far

    def __repr__(self):
        return f"LossScale(scale={self.scale:g}, good_steps={self.good_steps}, skipped={self.skipped})"

    def update(self, overflow: bool) -> bool:
        """Record one step's gradients; ``True`` if the optimizer should apply them."""
        self.record(overflow)
        return not overflow

    def record(self, overflow: bool):
        """:meth:`update` without the answer: all of its state changes at once, in its last line (a phase of a
        step, ``tinn.runtime.commit.commit``)."""
        scale, good, skipped = self.scale, self.good_steps + 1, self.skipped
        if overflow:
            scale, good, skipped = max(scale * self.backoff_factor, self.MIN), 0, skipped + 1
        elif good >= self.growth_interval:
            scale, good = min(scale * self.growth_factor, self.MAX), 0
        self.scale, self.good_steps, self.skipped = scale, good, skipped

    def state(self) -> dict:
        """What a checkpoint keeps (JSON numbers)."""
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped}

    def check_state(self, state, where: str = "LossScale") -> dict:
        """``state`` validated (else a ``ValueError`` starting with ``where``), ready for :meth:`load_state`."""
        ok = (isinstance(state, dict) and set(state) == {"scale", "good_steps", "skipped"}
              and all(isinstance(state[k], int) and not isinstance(state[k], bool) and 0 <= state[k] < 2 ** 31
                      for k in ("good_steps", "skipped"))
              and isinstance(state["scale"], (int, float)) and not isinstance(state["scale"], bool)
              and self.MIN <= state["scale"] <= self.MAX)
        if not ok:
            raise ValueError(f"{where}: invalid loss scale state {state!r}: expected {{'scale': a number in [2^-24, 2^24], "
                             f"'good_steps': int >= 0, 'skipped': int >= 0}}")
        return state

    def load_state(self, state: dict):
        self.scale, self.good_steps, self.skipped = float(state["scale"]), state["good_steps"], state["skipped"]


@ti.kernel
def _read_gradients(dst: ti.template(), dst_off: ti.i32, src: ti.template(), src_off: ti.i32, n: ti.i32,
                    n_rows: ti.i32, overflow: ti.types.ndarray(dtype=ti.i32, ndim=1)):
    """``dst[k, dst_off + i] = src[k, src_off + i]``; ``overflow[0]`` is 1 if any lies beyond float16's range
    (``|g| > 65504``) or is not finite, else 0 (set in a first loop: Taichi runs a kernel's loops in order)."""
    overflow[0] = 0
    C = ti.static(columns_per_task())
    tasks = (n + C - 1) // C
    for t in range(n_rows * tasks):
        k, c = t // tasks, t % tasks
        bad = 0
        for i in range(c * C, ti.min(c * C + C, n)):
            g = src[k, src_off + i]
            dst[k, dst_off + i] = g
            if not (ti.abs(g) <= FLOAT16_MAX):       # beyond float16, Inf or NaN
                bad = 1
        if bad:
            overflow[0] = 1


class MasterWeights:
    """The float32 copy of a float16 ``store`` that the optimizer steps (tcnn's ``params_full_precision``)."""

    def __init__(self, store: ParamStore):
        self.half = store
        self.store = ParamStore(store.n_instances, store.n_params, what="float32 master weights")
        self._flag = buffer((1,), ti.i32)       # a numpy argument a Vulkan kernel only writes returns stale memory
        self.follow()

    def _copy(self, dst: ParamStore, src: ParamStore, fields):
        every = np.ones(self.half.n_instances, np.int32)
        for name in fields:
            copy_columns(getattr(dst, name), dst.offset, getattr(src, name), src.offset, self.half.n_params, every)

    def follow(self):
        """Take the model's float16 weights as the masters (after ``set_params``, ``reset_params``, a tcnn load:
        tcnn's ``set_params``, ``masters = cast``)."""
        self._copy(self.store, self.half, ("params", "inference_params"))
        self._version = self.half.version

    def sync(self):
        """:meth:`follow` if the model's weights were set since the masters last did."""
        if self.half.version != self._version:
            self.follow()

    def read_gradients(self) -> bool:
        """The model's gradients into the masters'; ``True`` if any is beyond float16's range, Inf or NaN."""
        if not self.half.n_params:
            return False
        _read_gradients(self.store.grads, self.store.offset, self.half.grads, self.half.offset,
                        self.half.n_params, self.half.n_instances, self._flag)
        return bool(self._flag.to_numpy()[0])

    def publish(self):
        """Round the master weights and inference weights into the model's float16 ones."""
        self._copy(self.half, self.store, ("params", "inference_params"))
