"""The optimizer base class (tcnn ``optimizer.h``).

An optimizer is allocated for a parameter buffer of ``n_instances`` x ``n_params``
whose first ``n_matrix = sum(rows * cols of layer_sizes)`` entries are "matrix"
parameters (MLP weights) and the rest "non-matrix" ones (e.g. hash-grid entries).
``allocate(..., store)`` binds it to a model's store; then ``step()`` reads the model's
gradients (divided by ``loss_scale``) and updates its parameters in place.
``step(params, gradients)`` does the same on numpy arrays (:func:`step_arrays`), staged
through a store that belongs to the optimizer.

Network arrays: every state array is per instance, and so is the step counter
(``step_counts()``, tcnn's ``step()``). Instances that are not ``active`` in a step
(no samples) are left exactly as they were: no update, no moment decay, no count.
``active`` is ``None`` (all), a host sequence of network ids, or an int32 ``ti.ndarray`` mask
``(n_instances,)`` computed on the device: then the step reads nothing back. The step
counters live in int32 kernel arrays (``steps_array()``), counted by the kernels that step;
``step_counts()`` and ``state_dict()`` read them back. A counter saturates at ``2^31 - 2`` (it never wraps);
a state dict or checkpoint may hold counts up to ``2^30`` (``STEP_LIMIT``), a billion steps short of that.

Runtime scalars (learning rate, betas, ...) are kernel arguments, so changing them
never recompiles. The learning rate reaches a kernel as the scalar ``learning_rate`` and a
float32 ``(K,)`` array ``lr_scale(step)`` (ones, or a wrapper's schedule): wrappers such as
``ExponentialDecay`` scale it per network without touching the nested optimizer's value.

Writing an optimizer (the whole contract; wrappers: see ``wrapper.py``):

* ``KEYS`` — its config keys (:class:`~tinn.keys.Key`: default, rule, doc);
* ``STATE`` — the names of its state arrays, which ``state_dict()`` saves;
* ``create_state()`` — allocate them, once ``n_instances``, ``n_params``, ``n_matrix``,
  ``layer_sizes`` and ``slot`` (where its weights and gradients live) are set;
* ``update(step)`` — one step (:class:`~tinn.optimizers.step.Step`) of the instances with
  ``step.mask[k] != 0``, network ``k`` at learning rate ``learning_rate * lr_scale(step)[k]``: a phase of the
  step (``step.py``), so it changes state only in its last line (one kernel launch);
* ``inference_weights()`` — ``(field, offset)`` of separate inference weights (tcnn's
  ``custom_weights``), if it keeps any.

Stepping numpy arrays is the free function :func:`step_arrays`.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import taichi as ti

from ..batch import buffers as _buffers
from ..batch.batch import as_mask
from ..runtime.types import F32_1D, F32_2D, F32_3D, I32_1D, I32_2D  # noqa: F401 (the optimizers' aliases)
from ..keys import NON_NEGATIVE, UNIT_INTERVAL, Key, Options
from ..object import Object, ParametricObject
from ..params import ParamStore
from ..runtime.program import RuntimeBound, active
from ..runtime.commit import commit
from .step import STEP_LIMIT, Gate, Step, count_steps, later, new_counter


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
        self._publishes = False         # bound to a model's store (whose inference weights each step fills)

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
        """Change any of this optimizer's keys (e.g. the learning rate) between steps: every value (nested ones
        included) is checked first, then all change at one commit point (``tinn.runtime.commit``), or none."""
        commit(self._planned_update(config))

    def _planned_update(self, config: dict) -> list:
        """The phases (``step.py``) of :meth:`update_hyperparams`, every value checked; nothing changed yet."""
        if not isinstance(config, dict):
            raise TypeError(f"optimizer hyperparameters must be a dict, got {type(config).__name__}")
        return [partial(setattr, self, "hparams", self._validated({k: v for k, v in config.items() if k != "otype"}))]

    @property
    def learning_rate(self) -> float:
        return self.hparams["learning_rate"]

    @learning_rate.setter
    def learning_rate(self, value: float):
        self.hparams = self._validated({"learning_rate": value})

    # -- allocation ----------------------------------------------------------------
    def allocate(self, n_params: int, layer_sizes=(), n_instances: int = 1, store: ParamStore | None = None):
        """Create state for ``n_instances`` x ``n_params`` parameters (tcnn's ``allocate``).

        With a model's ``store``, ``step()`` then steps that model and fills the store's inference
        weights: with this optimizer's averaged weights if it keeps any (EMA, Average, Lookahead,
        Composite), else with the trained weights.
        Without one, the optimizer works on numpy arrays (:func:`step_arrays`) staged through
        a store of its own.
        """
        self._check_runtime()
        model_store = store is not None
        store = store if model_store else ParamStore(n_instances, n_params, "optimizer staging store")
        if (store.n_instances, store.n_params) != (n_instances, n_params):
            raise ValueError(f"store holds {store.n_instances} x {store.n_params} params, "
                             f"not {n_instances} x {n_params}")
        self._bind(Slot(store, store.params, store.offset, store.grads, store.offset, n_params), layer_sizes)
        self._publishes = model_store
        if model_store:
            self._publish(self.all_networks())

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
        self._steps = new_counter(self.n_instances)
        self._gated, self._skipped = new_counter(self.n_instances), new_counter(self.n_instances)
        self._unit_scale = _buffers.buffer((self.n_instances,), ti.f32)
        self._unit_scale.fill(1.0)

    def create_state(self):
        """Allocate the state arrays named in ``STATE`` (called once bound, when ``n_params > 0``)."""

    def _require_allocated(self):
        self._check_runtime()
        if self.slot is None:
            raise RuntimeError(f"{self.otype} optimizer is not allocated yet: call allocate() or step() first")

    # -- stepping ------------------------------------------------------------------
    def step(self, params=None, gradients=None, *, loss_scale: float = 1.0, active=None):
        """One step: of the model bound by :meth:`allocate` (no arrays), or of the float32 numpy array
        ``params`` updated in place from the numpy array ``gradients`` (:func:`step_arrays`).

        ``active``: ``None`` (every network), a host sequence of network ids, or an int32
        ``ti.ndarray`` mask ``(n_instances,)`` (1: step that network) that the step reads on the device.
        """
        self._check_runtime()
        if isinstance(params, ParametricObject):
            raise TypeError(f"{self.otype}.step() does not take the model: call optimizer.allocate(model.n_params, "
                            "model.layer_sizes(), model.n_instances, model.store) once, then step()")
        if params is not None:
            step_arrays(self, params, gradients, loss_scale=loss_scale, active=active)
            return
        if gradients is not None:
            raise TypeError("step() takes gradients only with numpy params")
        self._require_allocated()
        commit(self._bound_phases(loss_scale, active))

    def _bound_phases(self, loss_scale: float, active) -> list:
        """The phases (``step.py``) of a step of the bound slot, filling the model's inference weights (in the
        update itself where it can)."""
        store = self.slot.store
        mirrored = self._publishes and self.inference_weights() is None and self.mirrors()
        step = self._step(active, loss_scale, (store.inference_params, store.offset) if mirrored else None)
        phases = self._phases(step)
        if self._publishes and not mirrored:
            phases.append(partial(self._publish, step.mask))
        return phases

    def _step(self, active, loss_scale: float, publish_to=None) -> Step:
        """A top-level step of the networks ``active`` (:meth:`mask`), gated (``step.py``): its phases read the
        mask that its first kernel writes, without the networks whose gradients could make their state
        non-finite."""
        s = self.slot
        gate = Gate(self.mask(active), s.grads, s.g_off, s.n, self._skipped)
        return Step(self._gated, float(loss_scale), None, publish_to, gate)

    def skipped_updates(self) -> np.ndarray:
        """Per network, the updates not applied because a gradient (divided by the loss scale) was NaN, +-Inf or
        beyond ``tinn.optimizers.step.GRADIENT_BOUND`` since allocation: int64 ``(n_instances,)`` (a read-back)."""
        self._require_allocated()
        return self._skipped.to_numpy().astype(np.int64)

    def mask(self, active):
        """``active`` (module docstring) as the int32 ``(K,)`` mask that kernels read: a device mask as it
        is, host ids through :meth:`kernel_array` (uploaded on the device path when it changes)."""
        return as_mask(active, self.n_instances, lambda mask: self.kernel_array("active", mask))

    def all_networks(self):
        """The mask of every network as a kernel argument (copies of whole state arrays at allocation)."""
        return self.kernel_array("active", np.ones(self.n_instances, np.int32))

    def mirrors(self) -> bool:
        """Whether ``update`` can write every stepped weight to ``step.publish_to`` too (default: no, the
        step is followed by a copy into the inference weights)."""
        return False

    def _publish(self, mask):
        """Fill the model store's inference weights of the instances with ``mask[k] != 0``: this optimizer's
        averaged weights (tcnn's ``custom_weights``) or the trained ones."""
        slot = self.slot
        source = self.inference_weights() or (slot.params, slot.p_off)
        slot.store.publish(*source, mask)

    def _phases(self, step: Step) -> list:
        """One step's phases, changing nothing yet: count (the step's first kernel: it evaluates the gate), then
        update (``update`` sees the count including this step)."""
        count = partial(count_steps, self._steps, step, self.slot.grads, self._skipped)
        return [count] + ([partial(self.update, later(step))] if self.n_params else [])

    def lr_scale(self, step: Step):
        """float32 ``(K,)`` kernel array by which the kernels multiply ``learning_rate`` (a scalar
        argument) per network: the step's schedule, else ones."""
        return self._unit_scale if step.lr_scale is None else step.lr_scale

    def steps_array(self):
        """The int32 ``(K,)`` kernel array of completed steps (:meth:`step_counts` without the read-back)."""
        return self._steps if self.COUNTS_STEPS else self._children()[0][1].steps_array()

    def kernel_array(self, name: str, values: np.ndarray):
        """``values``, a small host array that this optimizer's kernels only read, as their argument
        (:class:`tinn.batch.buffers.Mirror`: on the device path uploaded only when it changes)."""
        if not active():
            return values
        if name not in self._mirrors:
            self._mirrors[name] = _buffers.Mirror()
        return self._mirrors[name](values)

    def update(self, step: Step):
        """One step of the instances with ``step.mask[k] != 0`` on ``slot``: gradients divided by
        ``step.loss_scale``, learning rate ``learning_rate * lr_scale(step)[k]``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement update()")

    def _children(self) -> list:
        """``(state prefix, optimizer)`` of the nested optimizers."""
        return []

    def step_counts(self) -> np.ndarray:
        """Completed steps per instance, ``(n_instances,)`` (tcnn's ``step()``)."""
        self._require_allocated()
        return self.steps_array().to_numpy().astype(np.int64)

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
        state = {"current_step": self._steps.to_numpy().astype(np.int64)} if self.COUNTS_STEPS else {}
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
            self._steps.from_numpy(np.asarray(state["current_step"]).astype(np.int32))
        for name, value in self.state_arrays().items():
            if isinstance(value, np.ndarray):
                value[...] = state[name]
            else:
                value.from_numpy(np.ascontiguousarray(state[name]))
        for prefix, child in self._children():
            child._load_state(unprefixed(prefix, state))


def step_arrays(optimizer: Optimizer, params: np.ndarray, gradients, *, loss_scale: float = 1.0, active=None):
    """One step of ``optimizer`` on numpy arrays: ``params`` (float32, C-contiguous, ``(n,)`` or ``(K, n)``) updated
    in place from ``gradients`` of its shape (the optimizer is allocated for that shape on first use, one matrix)."""
    optimizer._check_runtime()
    if not isinstance(params, np.ndarray) or params.dtype != np.float32 or not params.flags.c_contiguous:
        raise TypeError("step() takes no arrays (the model bound by allocate), or a contiguous float32 numpy "
                        "array of parameters")
    grads = np.asarray(gradients, dtype=np.float32)
    if grads.shape != params.shape:
        raise ValueError(f"gradients must have the parameters' shape {params.shape}, got {grads.shape}")
    flat = params.reshape(-1, params.shape[-1])
    as_mask(active, flat.shape[0])                          # bad ids are refused before anything changes
    store = None if optimizer.slot is None else optimizer.slot.store
    if store is None or (store.n_instances, store.n_params) != flat.shape:
        optimizer.allocate(flat.shape[1], [(1, flat.shape[1])], flat.shape[0])
        store = optimizer.slot.store
    step = optimizer._step(active, loss_scale)
    store.write(store.params, store.offset, flat)
    store.write(store.grads, store.offset, grads.reshape(flat.shape))
    commit(optimizer._phases(step) + [partial(_read_back, store, flat)])


def _read_back(store, flat: np.ndarray):
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
        if got.dtype.kind in "iu" and got.size and not (0 <= got.min() and got.max() <= STEP_LIMIT):
            raise ValueError(f"{what} state '{key}' must hold step counts in [0, {STEP_LIMIT}] (2^30: counters "
                             f"stop at 2^31 - 2, a run from there could not count its steps), got {got.min()} "
                             f"to {got.max()}")


def prefixed(prefix: str, state: dict) -> dict:
    return {f"{prefix}.{k}": v for k, v in state.items()}


def unprefixed(prefix: str, state: dict) -> dict:
    p = prefix + "."
    return {k[len(p):]: v for k, v in state.items() if k.startswith(p)}

