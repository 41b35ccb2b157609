"""The trainer (tcnn ``trainer.h``): forward, loss, backward and optimizer step.

``training_step(x, target)`` returns the loss as a float. The pieces are also
available separately: ``forward(x, target) -> ctx`` (``ctx.loss``), ``backward(ctx)``
and ``optimizer_step()``. With a network array, pass ``instance`` (or a dense
``(K, B_k, dims)`` batch); networks that got no samples in a step are untouched.
tinn computes in float32, so the loss scale is 1.

If the optimizer keeps separate inference weights (tcnn's ``custom_weights``: EMA,
Average, Lookahead, Composite with one of those), ``model.inference()`` reads them.

Checkpoints (see ``tinn.serialization``): ``save(path)`` / ``load(path)`` write and
restore everything needed to resume training bit-identically (configs, training and
inference weights, optimizer state) in one pickle-free ``.npz`` file;
``export_tcnn(path)`` / ``load_tcnn(path)`` exchange weights with tcnn through its
``Trainer::serialize()`` JSON snapshot.
"""
from __future__ import annotations

import numpy as np

from . import serialization
from ._runtime import RuntimeBound, as_batch
from .object import Context, DifferentiableObject, active_instances


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
        """Change optimizer and loss keys between steps, e.g. ``{"optimizer": {"learning_rate": 1e-4}}``.

        A top-level ``learning_rate`` acts as tcnn's ``set_learning_rate`` on every
        optimizer (wrappers forward it; ExponentialDecay sets ``base = value / factor``;
        Composite treats it as a factor on its nested rates).
        """
        if not isinstance(config, dict):
            raise TypeError(f"trainer hyperparameters must be a dict, got {type(config).__name__}")
        unknown = set(config) - {"otype", "optimizer", "loss"}
        if unknown:
            raise ValueError(f"Trainer.update_hyperparams: unknown sections {sorted(unknown)} "
                             "(valid: 'optimizer', 'loss')")
        if "optimizer" in config:
            self.optimizer.update_hyperparams(config["optimizer"])
        if "loss" in config:
            self.loss.update_hyperparams(config["loss"])

    @property
    def n_params(self) -> int:
        return self.model.n_params

    def params(self) -> np.ndarray:
        """The training parameters (tcnn's ``params()``), as ``model.params()``."""
        return self.model.params()

    def params_inference(self) -> np.ndarray:
        """The weights ``inference()`` reads (tcnn's ``params_inference()``)."""
        self._check_runtime()
        store = self.model.store
        values = store.read(store.inference_params, store.offset, self.model.n_params)
        return values[0] if self.model.n_instances == 1 else values

    # -- checkpoints -------------------------------------------------------------------
    def save(self, path):
        """Write configs, parameters and optimizer state to one ``.npz`` file at ``path``."""
        serialization.save(self, path)

    def load(self, path):
        """Restore a :meth:`save` checkpoint; a bad or mismatched file raises ``ValueError``
        and leaves the trainer unchanged."""
        serialization.load(self, path)

    def export_tcnn(self, path, instance: int | None = None):
        """Write tcnn's snapshot JSON (``n_params``, ``params_type``, ``params_binary``) of one network."""
        serialization.export_tcnn(self, path, instance)

    def load_tcnn(self, source, instance: int | None = None):
        """Load one network's parameters from a tcnn snapshot JSON (a path or the parsed dict)."""
        serialization.load_tcnn(self, source, instance)

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
        ctx.dense = dense
        ctx.loss, ctx.dL_doutput, ctx.instance_losses = self.loss._evaluate(
            y, t, q.reshape(-1, q.shape[-1]), pdf is not None, self.loss_scale, inst, model.n_instances,
            dense=dense is not None)
        return ctx

    def backward(self, ctx: Context):
        """Parameter gradients of ``ctx.loss`` (overwriting the previous ones)."""
        self._check_runtime()
        self._active = active_instances(ctx, self.model.n_instances)      # None: every network got samples
        if self._active is not None:
            self.model.store.zero_grad()                                    # networks without samples get 0
        self.model._backward(ctx, ctx.dL_doutput, False, overwrite=self._active is None)

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
