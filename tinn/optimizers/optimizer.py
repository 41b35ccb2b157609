"""The optimizer base class (tcnn ``optimizer.h``).

An optimizer is allocated for a parameter buffer of ``n_instances`` x ``n_params``
whose first ``n_matrix = sum(rows * cols of layer_sizes)`` entries are "matrix"
parameters (MLP weights) and the rest "non-matrix" ones (e.g. hash-grid entries).
``step(model)`` reads the model's gradients (divided by ``loss_scale``) and updates
its parameters in place. ``step(params, gradients)`` does the same on numpy arrays.
Networks listed as inactive (no samples this step) are left exactly as they were.
Runtime scalars (learning rate, betas, ...) are kernel arguments, so changing them
never recompiles.
"""

import numpy as np

from .._runtime import FieldTree, RuntimeBound
from ..object import Object, ParametricObject
from ..params import ParamStore


class Optimizer(Object, RuntimeBound):
    def __init__(self):
        self._bind_runtime()
        self._store = None
        self._tree = None

    # -- allocation --------------------------------------------------------------
    def allocate(self, n_params: int, layer_sizes=(), n_instances: int = 1, store: ParamStore | None = None):
        """Create state for ``n_instances`` x ``n_params`` parameters (tcnn's ``allocate``)."""
        self._check_runtime()
        self.n_params, self.n_instances = n_params, n_instances
        self.n_matrix = sum(r * c for r, c in layer_sizes)
        self._store = store or ParamStore(n_instances, n_params)
        self._tree = FieldTree(self._allocate_state) if self._has_state else None
        self._build_kernels()

    _has_state = False

    def _allocate_state(self, builder):
        """Place the optimizer's state fields into ``builder``."""

    def _build_kernels(self):
        raise NotImplementedError

    # -- stepping ----------------------------------------------------------------
    def step(self, target, gradients=None, *, loss_scale: float = 1.0, active=None):
        """Update ``target``'s parameters from its gradients.

        ``target`` is a model (anything with parameters) or a float32 numpy array of
        parameters, updated in place from the numpy array ``gradients`` of the same shape.
        ``active`` lists the instances that received samples (default: all).
        """
        self._check_runtime()
        if isinstance(target, ParametricObject):
            store = target.store
            if self._store is not store:
                self.allocate(target.n_params, target.layer_sizes(), target.n_instances, store)
            self._step_store(loss_scale, active)
            return
        params = target
        if not isinstance(params, np.ndarray) or params.dtype != np.float32 or not params.flags.c_contiguous:
            raise TypeError("step() takes a model, or a contiguous float32 numpy array of parameters")
        grads = np.asarray(gradients, dtype=np.float32)
        if grads.shape != params.shape:
            raise ValueError(f"gradients must have the parameters' shape {params.shape}, got {grads.shape}")
        flat = params.reshape(-1, params.shape[-1])
        if self._store is None or (self._store.n_instances, self._store.n_params) != flat.shape:
            self.allocate(flat.shape[1], [(1, flat.shape[1])], flat.shape[0])
        self._store.write(self._store.params, 0, flat)
        self._store.write(self._store.grads, 0, grads.reshape(flat.shape))
        self._step_store(loss_scale, active)
        flat[...] = self._store.read(self._store.params, 0, flat.shape[1])

    def _step_store(self, loss_scale, active):
        if active is None:
            active = np.ones(self.n_instances, np.int32)
        else:
            mask = np.zeros(self.n_instances, np.int32)
            mask[np.asarray(active)] = 1
            active = mask
        self._kernel_step(active, float(loss_scale))

    # -- hyperparameters -----------------------------------------------------------
    @property
    def learning_rate(self) -> float:
        return self.hparams["learning_rate"]

    @learning_rate.setter
    def learning_rate(self, value: float):
        self.hparams["learning_rate"] = float(value)

    def hyperparams(self):
        return {"otype": self.otype, **self.hparams}

    def update_hyperparams(self, config: dict):
        """Change any of this optimizer's keys (e.g. the learning rate) between steps."""
        merged = {**self.hparams, **{k: v for k, v in config.items() if k != "otype"}}
        self.hparams = type(self).from_config(merged).hparams
