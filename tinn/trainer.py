"""The trainer (tcnn ``trainer.h``): forward, loss, backward and optimizer step.

``training_step(x, target)`` returns the loss as a float. The pieces are also
available separately: ``forward(x, target) -> ctx`` (``ctx.loss``), ``backward(ctx)``
and ``optimizer_step()``. With a network array, pass ``instance`` (or a dense
``(K, B_k, dims)`` batch); networks that got no samples in a step are untouched.
tinn computes in float32, so the loss scale is 1.
"""
from __future__ import annotations

import numpy as np

from ._runtime import RuntimeBound, as_batch
from .object import Context, DifferentiableObject


class Trainer(RuntimeBound):
    loss_scale = 1.0

    def __init__(self, model: DifferentiableObject, optimizer, loss, *, seed: int | None = None):
        self._bind_runtime()
        self.model, self.optimizer, self.loss = model, optimizer, loss
        if seed is not None:
            model.reset_params(seed)
        store = model.store
        optimizer.allocate(model.n_params, model.layer_sizes(), model.n_instances, store)
        self._active = None

    def hyperparams(self) -> dict:
        return {"otype": "Trainer", "optimizer": self.optimizer.hyperparams(), "loss": self.loss.hyperparams()}

    def update_hyperparams(self, config: dict):
        if "optimizer" in config:
            self.optimizer.update_hyperparams(config["optimizer"])
        if "loss" in config:
            self.loss.update_hyperparams(config["loss"])

    def forward(self, x, target, instance=None, pdf=None) -> Context:
        """Model forward and loss; the context carries ``loss`` and ``dL_doutput``."""
        self._check_runtime()
        model = self.model
        x, inst, dense = model._prepare(x, instance)
        t = as_batch(target, model.n_output_dims, "target", allow_dense=dense is not None).reshape(-1, model.n_output_dims)
        if t.shape[0] != x.shape[0]:
            raise ValueError(f"target has {t.shape[0]} samples, x has {x.shape[0]}")
        q = np.ones((1, 1), np.float32) if pdf is None else as_batch(pdf, model.n_output_dims, "pdf",
                                                                     allow_dense=dense is not None)
        y, ctx = model._forward(x, inst)
        ctx.loss, ctx.dL_doutput, ctx.instance_losses = self.loss._evaluate(
            y, t, q.reshape(-1, q.shape[-1]), pdf is not None, self.loss_scale, inst, model.n_instances)
        return ctx

    def backward(self, ctx: Context):
        """Parameter gradients of ``ctx.loss`` (overwriting the previous ones)."""
        self._check_runtime()
        self.model.store.zero_grad()
        self.model._backward(ctx, ctx.dL_doutput, False)
        self._active = None if ctx.instance is None else np.unique(ctx.instance)

    def optimizer_step(self):
        self._check_runtime()
        self.optimizer.step(self.model, loss_scale=self.loss_scale, active=self._active)

    def training_step(self, x, target, instance=None, pdf=None, *, per_instance: bool = False):
        """One step; returns the loss, or ``(loss, per-network losses)`` with ``per_instance=True``."""
        ctx = self.forward(x, target, instance, pdf)
        self.backward(ctx)
        self.optimizer_step()
        if per_instance:
            return ctx.loss, ctx.instance_losses if ctx.instance_losses is not None else np.array([ctx.loss])
        return ctx.loss
