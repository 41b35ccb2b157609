"""SGD (tcnn ``optimizers/sgd.h``): ``w <- w - lr * (g + l2_reg * w)`` for every parameter.

Keys: ``learning_rate`` (1e-3), ``l2_reg`` (1e-8).
"""
import taichi as ti

from ..config import Options, optimizers
from .optimizer import Optimizer

_i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)


@optimizers.register("SGD")
class SGD(Optimizer):
    otype = "SGD"

    def __init__(self, learning_rate: float = 1e-3, l2_reg: float = 1e-8):
        super().__init__()
        self.hparams = {"learning_rate": float(learning_rate), "l2_reg": float(l2_reg)}

    @classmethod
    def from_config(cls, config, *, otype="SGD"):
        opt = Options("optimizer", otype, config)
        sgd = cls(opt.get("learning_rate", 1e-3), opt.get("l2_reg", 1e-8))
        opt.done()
        return sgd

    def _build_kernels(self):
        params, grads = self._store.params, self._store.grads
        K, n = self.n_instances, self.n_params

        @ti.kernel
        def step(active: _i32_1d, loss_scale: ti.f32, lr: ti.f32, l2_reg: ti.f32):
            for k, i in ti.ndrange(K, n):
                if active[k]:
                    w = params[k, i]
                    params[k, i] = w - lr * (grads[k, i] / loss_scale + l2_reg * w)

        self._step = step

    def _kernel_step(self, active, loss_scale):
        self._step(active, loss_scale, self.hparams["learning_rate"], self.hparams["l2_reg"])
