"""The optimizer base class (tcnn ``optimizer.h``).

An optimizer is allocated for a parameter buffer of ``n_instances`` x ``n_params``
whose first ``n_matrix = sum(rows * cols of layer_sizes)`` entries are "matrix"
parameters (MLP weights) and the rest "non-matrix" ones (e.g. hash-grid entries).
``step(model)`` reads the model's gradients (divided by ``loss_scale``) and updates
its parameters in place. ``step(params, gradients)`` does the same on numpy arrays.

Network arrays: every state array is per instance, and so is the step counter
(``step_counts()``, tcnn's ``step()``). Instances that are not ``active`` in a step
(no samples) are left exactly as they were: no update, no moment decay, no count.

Runtime scalars (learning rate, betas, ...) are kernel arguments, so changing them
never recompiles. The learning rate reaches a kernel as a per-instance ``(K,)``
array, ``learning_rate * lr_scale``: wrappers such as ``ExponentialDecay`` scale it
per network without touching the nested optimizer's configured value.

Writing an optimizer (the whole contract; wrappers: see ``wrapper.py``):

* ``KEYS`` — its config keys (:class:`~tinn.keys.Key`: default, rule, doc);
* ``STATE`` — the names of its state arrays, which ``state_dict()`` saves;
* ``create_state()`` — allocate them, once ``n_instances``, ``n_params``, ``n_matrix``,
  ``layer_sizes`` and ``slot`` (where its weights and gradients live) are set;
* ``update(active, loss_scale, lr)`` — one step of the instances with ``active[k] != 0``;
* ``inference_weights()`` — ``(field, offset)`` of separate inference weights (tcnn's
  ``custom_weights``), if it keeps any.

Stepping numpy arrays is the free function :func:`step_arrays`.
"""
from __future__ import annotations

import numpy as np

from .. import _buffers
from .._types import F32_1D, F32_2D, F32_3D, I32_1D, I32_2D  # noqa: F401 (the optimizers' aliases)
from .._program import RuntimeBound, current_program
from ..keys import NON_NEGATIVE, UNIT_INTERVAL, Key, Options
from ..object import Object, ParametricObject
from ..params import ParamStore




def zeros(shape, dtype):
    """A zeroed ``ti.ndarray``: optimizer state that no model kernel reads (no per-array recompiles)."""
    return _buffers.buffer(shape, dtype)


class Slot:
    """Weights ``params[k, p_off + i]`` and gradients ``grads[k, g_off + i]`` for ``i < n``."""

    def __init__(self, store: ParamStore, params, p_off: int, grads, g_off: int, n: int):
        self.store, self.params, self.p_off, self.grads, self.g_off, self.n = store, params, p_off, grads, g_off, n

    def read(self, field, offset: int) -> np.ndarray:
        return self.store.read(field, offset, self.n)

    def write(self, field, offset: int, values: np.ndarray):
        self.store.write(field, offset, values)


_SCRATCH: dict = {}


def scratch_store(n_instances: int, n_params: int) -> ParamStore:
    """The store that stages numpy arrays for ``step(params, gradients)``, shared per shape.

    Every numpy step writes the parameters and gradients before updating, so optimizers
    of the same shape can share it (and the kernels compiled for its fields).
    """
    program = current_program()
    store = _SCRATCH.get((n_instances, n_params))
    if store is None or store._program is not program:
        store = _SCRATCH[(n_instances, n_params)] = ParamStore(n_instances, n_params)
    return store


LEARNING_RATE = Key(1e-3, NON_NEGATIVE, "step size")
EPSILON = Key(1e-8, NON_NEGATIVE, "added to the denominator")
RELATIVE_DECAY = Key(0.0, NON_NEGATIVE, "weight decay proportional to the weight")
ABSOLUTE_DECAY = Key(0.0, NON_NEGATIVE, "weight decay of constant size toward 0")


def beta(default: float, doc: str) -> Key:
    """A moving-average decay in [0, 1)."""
    return Key(default, UNIT_INTERVAL, doc)


def l2_reg(default: float) -> Key:
    return Key(default, NON_NEGATIVE, "L2 regularisation: adds l2_reg * w to the gradient")


class Optimizer(Object, RuntimeBound):
    """Base of every optimizer: hyperparameters, allocation, stepping, state (module docstring).

    State arrays are ``ti.ndarray``s (see :func:`zeros`), numpy arrays, or, for arrays that
    model kernels read as fields (inference weights, a gradient pool), :class:`~tinn.params.Buffer` objects.
    ``COUNTS_STEPS``: the optimizer keeps (and saves) its own step counter; the others
    report their first nested optimizer's.
    """

    KEYS: dict = {}
    STATE: tuple = ()
    COUNTS_STEPS = True

    def __init__(self, **hparams):
        self._bind_runtime()
        unknown = set(hparams) - set(self.KEYS)
        if unknown:
            raise TypeError(f"{self.otype} got unknown hyperparameters {sorted(unknown)}")
        self.hparams = Options("optimizer", self.otype, hparams).read(self.KEYS)
        self.slot: Slot | None = None
        self.n_params, self.n_instances, self.n_matrix, self.layer_sizes = 0, 1, 0, []
        self._mirrors = {}

    # -- configuration -------------------------------------------------------------
    @classmethod
    def from_config(cls, config, *, otype=None):
        opt = Options("optimizer", otype or cls.otype, config)
        values = opt.read(cls.KEYS)
        opt.done()
        return cls(**values)

    def _validated(self, changes: dict) -> dict:
        """This optimizer's hyperparameters with ``changes`` applied, checked like a config."""
        opt = Options("optimizer", self.otype, {**self.hparams, **changes})
        values = opt.read(self.KEYS)
        opt.done()
        return values

    def hyperparams(self) -> dict:
        return {"otype": self.otype, **self.hparams}

    def update_hyperparams(self, config: dict):
        """Change any of this optimizer's keys (e.g. the learning rate) between steps."""
        if not isinstance(config, dict):
            raise TypeError(f"optimizer hyperparameters must be a dict, got {type(config).__name__}")
        self.hparams = self._validated({k: v for k, v in config.items() if k != "otype"})

    @property
    def learning_rate(self) -> float:
        return self.hparams["learning_rate"]

    @learning_rate.setter
    def learning_rate(self, value: float):
        self.hparams = self._validated({"learning_rate": value})

    # -- allocation ----------------------------------------------------------------
    def allocate(self, n_params: int, layer_sizes=(), n_instances: int = 1, store: ParamStore | None = None):
        """Create state for ``n_instances`` x ``n_params`` parameters (tcnn's ``allocate``).

        With a model's ``store``, every step then fills the store's inference weights: with
        this optimizer's averaged weights if it keeps any (EMA, Average, Lookahead, Composite),
        else with the trained weights.
        Without one, the optimizer works on numpy arrays (:func:`step_arrays`) staged through
        a scratch store.
        """
        self._check_runtime()
        model_store = store is not None
        store = store if model_store else scratch_store(n_instances, n_params)
        if (store.n_instances, store.n_params) != (n_instances, n_params):
            raise ValueError(f"store holds {store.n_instances} x {store.n_params} params, "
                             f"not {n_instances} x {n_params}")
        self._bind(Slot(store, store.params, store.offset, store.grads, store.offset, n_params), layer_sizes)
        if model_store:
            self._publish(np.ones(n_instances, np.int32))

    def _bind(self, slot: Slot, layer_sizes):
        """Use ``slot``'s weights and gradients, and create the state for them."""
        self._set_slot(slot, layer_sizes)
        if self.n_params:
            self.create_state()

    def _set_slot(self, slot: Slot, layer_sizes):
        self.slot = slot
        self.n_instances, self.n_params = slot.store.n_instances, slot.n
        self.layer_sizes = [(int(r), int(c)) for r, c in layer_sizes]
        self.n_matrix = sum(r * c for r, c in self.layer_sizes)
        if self.n_matrix > self.n_params:
            raise ValueError(f"layer_sizes cover {self.n_matrix} params, more than the {self.n_params} to optimize")
        self._steps = np.zeros(self.n_instances, np.int64)

    def create_state(self):
        """Allocate the state arrays named in ``STATE`` (called once bound, when ``n_params > 0``)."""

    def _require_allocated(self):
        self._check_runtime()
        if self.slot is None:
            raise RuntimeError(f"{self.otype} optimizer is not allocated yet: call allocate() or step() first")

    # -- stepping ------------------------------------------------------------------
    def step(self, target, gradients=None, *, loss_scale: float = 1.0, active=None):
        """Update ``target``'s parameters from its gradients.

        ``target`` is a model (anything with parameters), or a float32 numpy array of
        parameters updated in place from the numpy array ``gradients`` (:func:`step_arrays`).
        ``active`` lists the instances that received samples (default: all).
        """
        self._check_runtime()
        if not isinstance(target, ParametricObject):
            step_arrays(self, target, gradients, loss_scale=loss_scale, active=active)
            return
        store = target.store
        if self.slot is None or self.slot.store is not store:
            self.allocate(target.n_params, target.layer_sizes(), target.n_instances, store)
        mask = active_mask(self.n_instances, active)
        if self.inference_weights() is None and self.mirrors():      # the step itself fills them
            self.mirror = (store.inference_params, store.offset)
        try:
            self._advance(mask, float(loss_scale), None)
        finally:
            mirrored, self.mirror = self.mirror is not None, None
        if not mirrored:
            self._publish(mask)

    mirror = None
    """``(field, offset)`` to which ``update`` also writes the weights it steps (the model's inference
    weights), during a top-level step of an optimizer that :meth:`mirrors`; else ``None``."""

    def mirrors(self) -> bool:
        """Whether ``update`` can write every stepped weight to :attr:`mirror` too (default: no, the
        step is followed by a copy into the inference weights)."""
        return False

    def _publish(self, active: np.ndarray):
        """Fill the model store's inference weights of the ``active`` instances: this optimizer's
        averaged weights (tcnn's ``custom_weights``) or the trained ones."""
        slot = self.slot
        source = self.inference_weights() or (slot.params, slot.p_off)
        slot.store.publish(*source, self.kernel_array("active", active))

    def _advance(self, active: np.ndarray, loss_scale: float, lr_scale):
        """Count and run one step of the instances with ``active[k] != 0`` (int32 mask); ``lr_scale``
        (K,) or None scales the learning rate (a wrapper's schedule)."""
        self._steps += active
        if self.n_params:
            self.update(active, loss_scale, self._lr_array(lr_scale))

    def _lr_array(self, lr_scale) -> np.ndarray:
        lr = np.float32(self.learning_rate)
        if lr_scale is None:
            return np.full(self.n_instances, lr, np.float32)
        return (lr * lr_scale).astype(np.float32)

    def kernel_array(self, name: str, values: np.ndarray):
        """``values``, a small host array that this optimizer's kernels only read, as their argument
        (:class:`tinn._buffers.Mirror`: on the device path uploaded only when it changes)."""
        if name not in self._mirrors:
            self._mirrors[name] = _buffers.Mirror()
        return self._mirrors[name](values)

    def update(self, active: np.ndarray, loss_scale: float, lr: np.ndarray):
        """One step of the instances with ``active[k] != 0`` on ``slot``: gradients divided by
        ``loss_scale``, learning rate ``lr[k]`` per instance."""
        raise NotImplementedError(f"{type(self).__name__} does not implement update()")

    def _children(self) -> list:
        """``(state prefix, optimizer)`` of the nested optimizers."""
        return []

    def step_counts(self) -> np.ndarray:
        """Completed steps per instance, ``(n_instances,)`` (tcnn's ``step()``)."""
        self._require_allocated()
        return self._steps.copy() if self.COUNTS_STEPS else self._children()[0][1].step_counts()

    # -- inference weights ---------------------------------------------------------
    def inference_weights(self):
        """``(field, offset)`` of separate inference weights, or ``None`` (inference reads the trained ones)."""
        return None

    def custom_weights(self):
        """The separate inference weights (tcnn's ``custom_weights``) as numpy, or ``None``."""
        self._require_allocated()
        custom = self.inference_weights()
        if custom is None:
            return None
        values = self.slot.read(*custom)
        return values[0] if self.n_instances == 1 else values

    # -- state ---------------------------------------------------------------------
    def state_arrays(self) -> dict:
        """The state arrays by name (``STATE``; none before any parameter exists)."""
        return {name: getattr(self, name) for name in self.STATE} if self.n_params else {}

    def state_dict(self) -> dict:
        """Everything needed to resume: numpy arrays by name (nested optimizers' keys prefixed)."""
        self._require_allocated()
        state = {"current_step": self._steps.copy()} if self.COUNTS_STEPS else {}
        for name, value in self.state_arrays().items():
            state[name] = value.copy() if isinstance(value, np.ndarray) else value.to_numpy()
        for prefix, child in self._children():
            state.update(prefixed(prefix, child.state_dict()))
        return state

    def load_state_dict(self, state: dict):
        """Restore :meth:`state_dict`; checks every array before changing anything."""
        self._check_runtime()
        check_state(self.state_dict(), state, self.otype)
        self._load_state(state)

    def _load_state(self, state: dict):
        if self.COUNTS_STEPS:
            self._steps[...] = state["current_step"]
        for name, value in self.state_arrays().items():
            if isinstance(value, np.ndarray):
                value[...] = state[name]
            else:
                value.from_numpy(np.ascontiguousarray(state[name]))
        for prefix, child in self._children():
            child._load_state(unprefixed(prefix, state))


def active_mask(n_instances: int, active) -> np.ndarray:
    """int32 ``(n_instances,)``: 1 for the instances listed in ``active`` (all for ``None``)."""
    if active is None:
        return np.ones(n_instances, np.int32)
    mask = np.zeros(n_instances, np.int32)
    mask[np.asarray(active, dtype=np.int64)] = 1
    return mask


def step_arrays(optimizer: Optimizer, params: np.ndarray, gradients, *, loss_scale: float = 1.0, active=None):
    """One step of ``optimizer`` on numpy arrays: ``params`` (float32, C-contiguous, ``(n,)`` or
    ``(K, n)``) is updated in place from ``gradients`` of the same shape. The optimizer is
    (re)allocated for that shape on first use, all parameters as one matrix."""
    optimizer._check_runtime()
    if not isinstance(params, np.ndarray) or params.dtype != np.float32 or not params.flags.c_contiguous:
        raise TypeError("step() takes a model, or a contiguous float32 numpy array of parameters")
    grads = np.asarray(gradients, dtype=np.float32)
    if grads.shape != params.shape:
        raise ValueError(f"gradients must have the parameters' shape {params.shape}, got {grads.shape}")
    flat = params.reshape(-1, params.shape[-1])
    store = None if optimizer.slot is None else optimizer.slot.store
    if store is None or (store.n_instances, store.n_params) != flat.shape:
        optimizer.allocate(flat.shape[1], [(1, flat.shape[1])], flat.shape[0])
        store = optimizer.slot.store
    store.write(store.params, store.offset, flat)
    store.write(store.grads, store.offset, grads.reshape(flat.shape))
    optimizer._advance(active_mask(optimizer.n_instances, active), float(loss_scale), None)
    flat[...] = store.read(store.params, store.offset, flat.shape[1])


def check_state(expected: dict, state, what: str):
    """Raise ``ValueError`` unless ``state`` has exactly ``expected``'s keys, shapes and dtypes."""
    if not isinstance(state, dict):
        raise TypeError(f"{what} state must be a dict of numpy arrays, got {type(state).__name__}")
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:
        raise ValueError(f"{what} state does not match this optimizer: missing {missing}, unexpected {extra}")
    for key, want in expected.items():
        got = state[key]
        if not isinstance(got, np.ndarray) or got.shape != want.shape or got.dtype != want.dtype:
            desc = f"{got.dtype}{list(got.shape)}" if isinstance(got, np.ndarray) else type(got).__name__
            raise ValueError(f"{what} state '{key}' must be {want.dtype}{list(want.shape)}, got {desc}")


def prefixed(prefix: str, state: dict) -> dict:
    return {f"{prefix}.{k}": v for k, v in state.items()}


def unprefixed(prefix: str, state: dict) -> dict:
    p = prefix + "."
    return {k[len(p):]: v for k, v in state.items() if k.startswith(p)}

