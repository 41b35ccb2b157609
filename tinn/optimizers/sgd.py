"""SGD (tcnn ``optimizers/sgd.h``): ``w <- w - lr * (g + l2_reg * w)`` for every parameter.

No matrix/non-matrix distinction.
State: ``current_step``.
"""
import taichi as ti

from ..registry import optimizers
from ..runtime.kernels import ARENA, FLAT, at, columns_per_task, flat_args, set_at, specialised
from .optimizer import F32_1D, I32_1D, LEARNING_RATE, Optimizer, l2_reg


@specialised
def _sgd_kernel(flat: bool, mirror: bool):
    """The step of ``n`` parameters of every network ``k`` with ``active[k]``: ``w -= lr lr_scale[k] (g / loss_scale
    + l2_reg w)``, a task per network and run of ``columns_per_task()`` parameters (``P``, ``I``, ``G`` as
    :func:`~tinn.runtime.kernels.flat_args` gives them); ``mirror``: each stepped weight also to ``I[k, io + i]``
    (the model's inference weights, instead of a copy after the step). ``n`` is an argument: one kernel serves
    models of every size."""
    Rows = FLAT if flat else ARENA
    C = columns_per_task()

    @ti.kernel
    def step(P: Rows, ps: ti.i32, po: ti.i32, I: Rows, is_: ti.i32, io: ti.i32, G: Rows, gs: ti.i32, go: ti.i32,
             active: I32_1D, loss_scale: ti.f32, lr: ti.f32, lr_scale: F32_1D, l2_reg: ti.f32, n: ti.i32):
        tasks = (n + C - 1) // C
        for task in range(active.shape[0] * tasks):
            k, c = task // tasks, task % tasks
            if active[k]:
                a = lr * lr_scale[k]
                for i in range(c * C, ti.min(c * C + C, n)):
                    w = at(P, ps, k, po + i)
                    w -= a * (at(G, gs, k, go + i) / loss_scale + l2_reg * w)
                    set_at(P, ps, k, po + i, w)
                    if ti.static(mirror):
                        set_at(I, is_, k, io + i, w)

    return step


@optimizers.register("SGD")
class SGD(Optimizer):
    otype = "SGD"
    KEYS = {"learning_rate": LEARNING_RATE, "l2_reg": l2_reg(1e-8)}

    def mirrors(self) -> bool:
        """Every weight of a stepped network is written (so the step can fill the inference weights)."""
        return True

    def update(self, step):
        s = self.slot
        I, io = step.publish_to or (s.params, s.p_off)
        flat, ((P, ps), (I, is_), (G, gs)) = flat_args(s.params, I, s.grads)
        _sgd_kernel(flat, step.publish_to is not None)(
            P, ps, s.p_off, I, is_, io, G, gs, s.g_off, step.mask, step.loss_scale, self.learning_rate,
            self.lr_scale(step), self.hparams["l2_reg"], s.n)
