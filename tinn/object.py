"""Base classes mirroring tcnn's ``object.h``.

* :class:`Object` — ``hyperparams()`` returns the full config, ``name`` its otype.
* :class:`ParametricObject` — ``n_params``, ``layer_sizes()``, ``params()`` /
  ``set_params()`` / ``gradients()`` as flat float32 numpy copies (shape
  ``(n_params,)``, or ``(n_instances, n_params)`` for network arrays).
* :class:`DifferentiableObject` — ``inference(x)``, ``forward(x) -> (y, ctx)``,
  ``backward(ctx, dL_dy) -> dL_dx`` and the second order
  ``backward_backward_input(ctx, dL_ddLdx, dL_dy) -> (dL_ddLdy, dL_dx)``. Public methods check their
  arguments and hand each batch, of the path's one kind (a contiguous numpy array on the host path, a
  ``ti.ndarray`` on the device path: ``tinn.batch.batch.as_batch``), to the private ``_inference`` / ``_forward`` /
  ``_backward`` / ``_backward_backward_input`` (and ``_input_gradient``: dL/dx alone) of each component, whose outputs are at least
  ``n_output_dims`` wide (an encoding's own padding included) and whose output gradients are
  ``n_output_dims`` wide.

Parameter gradients follow tcnn's ``GradientMode``: ``mode="overwrite"``
(default) replaces them, ``"accumulate"`` adds to them.
"""
from __future__ import annotations

import functools

import numpy as np

from .batch.batch import Batch, as_batch, callers_kind, callers_output, check_out, is_device
from .batch.census import Request
from .batch.faults import Faults
from .keys import check_int, check_seed
from .params import ParamStore
from .runtime.program import RuntimeBound, active
from .runtime.kernels import fill_columns
from .runtime.rng import Pcg32
from .runtime.sample import SampleFuncs

GRADIENT_MODES = ("overwrite", "accumulate")

INFERENCE_MEMORY = 256 << 20
"""Bytes of batch-sized arrays a pass of ``inference`` may hold: a batch that needs more is cut into
chunks (``config_hash``: about 280 bytes a sample, chunks of about 970,000 samples)."""

TRAINING_MEMORY = 512 << 20
"""Bytes of batch-sized arrays a training pass (forward, loss, backward) may hold: a larger batch is
processed in chunks, its gradients accumulated over them (``config_hash``: about 800 bytes a sample)."""

MIN_CHUNK = 1 << 14
"""The fewest samples a chunk has, whatever the model."""


def chunk_samples(model, training: bool) -> int:
    """Samples per pass of a batch through ``model``: as many as ``TRAINING_MEMORY`` (or
    ``INFERENCE_MEMORY``) bytes hold at ``model._floats_per_sample(training)`` floats each, at least
    ``MIN_CHUNK``."""
    budget = TRAINING_MEMORY if training else INFERENCE_MEMORY
    return max(MIN_CHUNK, budget // (4 * max(1, model._floats_per_sample(training))))

INIT_CHUNK = 1 << 22
"""Parameters drawn per batch of instances at initialisation (bounds the generator's temporaries)."""


class Object:
    """Anything built from a JSON config: ``hyperparams()`` rebuilds it."""

    otype: str = ""

    @property
    def name(self) -> str:
        return self.hyperparams()["otype"]

    def hyperparams(self) -> dict:
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}({self.hyperparams()})"


class Context:
    """What ``forward`` keeps for ``backward`` (tcnn's opaque ``Context``): the object that made it,
    its input ``x``, the call's :class:`~tinn.batch.batch.Batch` and whatever the object saved."""

    def __init__(self, owner, x, batch: Batch, **saved):
        self.owner, self.x, self.batch = owner, x, batch
        self.__dict__.update(saved)


class _Unbound:
    """``ParametricObject.store`` before a store is bound: the parameter store that ``tinn.params.allocate`` binds
    (a model allocates it in its constructor, ``create_encoding`` / ``create_network`` for a component on its own;
    reading it allocates nothing). Reading it unbound raises; :meth:`ParametricObject.bind` sets the object's own
    attribute, which is read directly from then on (this descriptor defines no ``__set__``)."""

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        raise RuntimeError(f"this {type(obj).__name__} has no parameter memory: build it with tinn.create_encoding "
                           f"or tinn.create_network (which allocate it), or call tinn.params.allocate on it")


class ParametricObject(Object, RuntimeBound):
    """An object whose parameters live in a slice of a :class:`ParamStore`."""

    n_params: int = 0

    def __init__(self, n_instances: int = 1, seed: int = 1337):
        self._bind_runtime()
        self.n_instances = check_int(n_instances, "n_instances", 1)
        self.seed = check_seed(seed)
        self._offset = 0

    # -- storage -------------------------------------------------------------
    def layer_sizes(self) -> list:
        """``(rows, cols)`` of each weight matrix; optimizers treat the rest as non-matrix params."""
        return []

    def initial_params(self, rng: Pcg32) -> np.ndarray:
        """Draw this object's initial parameters, ``rng.shape + (n_params,)``, from ``rng`` (tcnn's order;
        ``rng`` may stand for one generator per instance)."""
        return np.zeros(rng.shape + (self.n_params,), np.float32)

    def bind(self, store: ParamStore, offset: int):
        """Use columns ``[offset, offset + n_params)`` of ``store``'s fields as this object's parameters
        (``offset`` is absolute: ``store.offset`` plus the object's place in the model's buffer)."""
        self.store, self._offset = store, offset
        self.__dict__.pop("_sample_cache", None)          # per-sample funcs close over the old store

    store = _Unbound()

    def reset_params(self, seed: int):
        """Initialise every instance as tcnn does: instance k draws from ``pcg32(seed, seq=k+1)``
        (all instances of a chunk at once)."""
        self._check_runtime()
        K = self.n_instances
        try:
            values = np.empty((K, self.n_params), np.float32)
            chunk = max(1, INIT_CHUNK // max(1, self.n_params))
            for lo in range(0, K, chunk):
                hi = min(lo + chunk, K)
                values[lo:hi] = self.initial_params(Pcg32(seed, seq=np.arange(lo + 1, hi + 1)))
        except MemoryError:
            raise MemoryError(f"{self}: not enough memory to draw the initial parameters of {K} x {self.n_params} "
                              f"float32 ({K * self.n_params * 4 / 2 ** 20:.0f} MiB)") from None
        self.store.set(self._offset, values)

    def _settle(self):
        """Raise the ``ValueError`` of an inference of a bad device batch not yet reported (a read-back only if
        device inferences ran since the last settle, ``DifferentiableObject._faults``): the calls that read from
        the device call it (``params()``, ``gradients()``, ``forward``, an inference of a host batch, and the
        trainer's reads)."""
        faults = self.__dict__.get("_faults")
        if faults is not None:
            faults.settle(self.n_instances)

    def _shape(self, a: np.ndarray) -> np.ndarray:
        return a[0] if self.n_instances == 1 else a

    def params(self) -> np.ndarray:
        """A float32 copy of the training parameters θ, in tcnn's order (network matrices, then the encoding):
        shape ``(n_params,)``, or ``(n_instances, n_params)`` for a network array."""
        self._check_runtime()
        self._settle()
        if not self.n_params:                       # no store to read (a Taichi field cannot have size 0)
            return self._shape(np.zeros((self.n_instances, 0), np.float32))
        return self._shape(self.store.read(self.store.params, self._offset, self.n_params))

    def gradients(self) -> np.ndarray:
        """A float32 copy of the accumulated gradients dL/dθ, shaped as :meth:`params`."""
        self._check_runtime()
        self._settle()
        if not self.n_params:
            return self._shape(np.zeros((self.n_instances, 0), np.float32))
        return self._shape(self.store.read(self.store.grads, self._offset, self.n_params))

    def set_params(self, values):
        """Set θ (the training weights; the inference weights follow at the optimizer's next step) from
        floating-point ``values`` shaped as :meth:`params` (``(n_params,)`` or ``(n_instances, n_params)``).
        ``TypeError`` for another dtype, ``ValueError`` for another shape, a NaN, an infinity or a value
        beyond float32's range; nothing is written then."""
        self._check_runtime()
        arr = np.asarray(values)
        if not np.issubdtype(arr.dtype, np.floating):
            raise TypeError(f"params must be floating point, got {arr.dtype}")
        if arr.size != self.n_instances * self.n_params or arr.ndim not in (1, 2) or arr.shape[-1] != self.n_params:
            want = (self.n_params,) if self.n_instances == 1 else (self.n_instances, self.n_params)
            raise ValueError(f"params must have shape {want}, got {arr.shape}")
        with np.errstate(over="ignore"):
            arr = arr.astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(arr.reshape(-1)))
        if bad.size:
            raise ValueError(f"params must be finite float32 values; {bad.size} are not (NaN, infinite or beyond "
                             f"float32's range ±3.4e38), the first at flat index {bad[0]}")
        if self.n_params:
            self.store.set(self._offset, arr)

    def _zero_gradients(self):
        if self.n_params:
            fill_columns(self.store.grads, self._offset, self.n_params, self.n_instances, 0.0)     # on the device


class DifferentiableObject(SampleFuncs, ParametricObject):
    """tcnn's ``DifferentiableObject``: batch inference, forward and hand-written backward; and the same
    model per sample in a user's kernel (``func``, ``forward_func``, ``backward_func``, ``jacobian_func``:
    see ``tinn.runtime.sample``)."""

    n_input_dims: int
    n_output_dims: int
    padded_output_width: int

    def _input(self, x, instance, deferred: bool):
        """The batch ``x`` checked (:func:`~tinn.batch.batch.as_batch`; a device batch's values left to the census if
        ``deferred``), of the path's kind, not yet flattened."""
        return as_batch(x, self.n_input_dims, allow_dense=self.n_instances > 1 and instance is None, finite=True,
                        deferred=deferred)

    def _batch(self, arr, instance, deferred: bool) -> Batch:
        """The :class:`~tinn.batch.batch.Batch` of a checked input ``arr``; ``deferred`` (an inference): a device
        batch's values and ids are checked on the device by a census that writes this object's fault record
        (:meth:`_settle`), nothing read back; shapes, dtypes and host ids are checked here."""
        census = None
        if deferred:                                    # (a dense batch's networks need no sort)
            census = Request(faults=self._faults, reuse=True, final=True,
                             sort=self._sorts_routed() and len(arr.shape) == 2)
        return Batch.of(arr, instance, self.n_instances, census=census)

    @functools.cached_property
    def _faults(self) -> Faults:
        """The record of this object's first inference of a bad device batch since it was last reported."""
        return Faults(f"inference call {{}} of this {type(self).__name__}'s device batches")

    def _finish(self, y: np.ndarray, batch: Batch, caller, flat: bool = False):
        """The output ``(batch, n_output_dims)`` of the ``caller``'s kind, in a dense batch's layout unless ``flat``."""
        return callers_output(y, self.n_output_dims, None if flat else batch.dense, caller)

    def inference(self, x, instance=None, *, out=None) -> np.ndarray:
        """Outputs ``(batch, n_output_dims)`` for inputs ``(batch, n_input_dims)``; with a network array,
        ``instance`` ``(batch,)`` int32 routes each sample, or ``x`` is a dense ``(K, B_k, n_input_dims)``.
        A batch larger than :func:`chunk_samples` allows runs in chunks (bounded memory). Results have the
        kind of array the caller passed (numpy, or ``ti.ndarray``), here and in every method below.

        ``out``: a float32 array of the result's shape and of ``x``'s kind to write the outputs into (and
        return); on the device path the network's last kernel writes there, with no copy."""
        caller = x
        self._check_runtime()
        if not is_device(caller):
            self._settle()                            # (the call reads its outputs back anyway)
        arr = self._input(x, instance, deferred=active())
        device_out = out is not None and check_out(out, caller, tuple(arr.shape[:-1]) + (self.n_output_dims,))
        batch = self._batch(arr, instance, deferred=active())
        x, ops, chunk = batch.x, batch.ops, chunk_samples(self, training=False)
        if batch.on_device and (device_out or (batch.dense is not None and is_device(caller))):
            if out is None:                             # a dense batch's outputs, written in its layout
                out = ops.empty(tuple(arr.shape[:-1]) + (self.n_output_dims,))
            return self._inference_into(x, batch, out)
        if batch.size <= chunk or batch.on_device:       # a device batch is not cut
            y = self._finish(self._inference(x, batch), batch, caller)
            return y if out is None else ops.copy_into(out, y)
        y = np.empty((batch.size, self.n_output_dims), np.float32) if out is None else out.reshape(batch.size, -1)
        for lo in range(0, batch.size, chunk):
            hi = min(lo + chunk, batch.size)
            part = batch.chunk(lo, hi)
            y[lo:hi] = ops.host(self._inference(part.x, part))[:, : self.n_output_dims]
        if out is not None:
            return out
        return callers_kind(y.reshape(batch.dense + (-1,)) if batch.dense else y, caller)

    def _inference_into(self, x, batch: Batch, out):
        """Outputs of a device batch written into the device buffer ``out`` ``(batch, n_output_dims)``, or a dense
        batch's ``(K, B_k, n_output_dims)`` (a component whose last kernel can write there overrides this);
        returns ``out``."""
        return batch.ops.copy_into(out, self._finish(self._inference(x, batch), batch, out, flat=True))

    def forward(self, x, instance=None):
        """``(output, ctx)``: the output as :meth:`inference` gives it, at the training weights; keep
        ``ctx`` for :meth:`backward` (``ctx.batch``: the call's :class:`~tinn.batch.batch.Batch`, its routing
        how the batch reached the networks)."""
        self._check_runtime()
        batch = self._batch(self._input(x, instance, False), instance, False)
        self._settle()
        y, ctx = self._forward(batch.x, batch)
        return self._finish(y, batch, x), ctx

    def backward(self, ctx: Context, dL_doutput, *, input_gradient: bool = True, mode: str = "overwrite"):
        """Accumulate (or overwrite) parameter gradients; return ``dL/dinput`` unless ``input_gradient=False``
        (of ``dL_doutput``'s kind)."""
        g = self._output_gradient(ctx, dL_doutput, mode)
        dx = self._backward(ctx, g, input_gradient, self._gradient_mode(ctx, mode))
        return None if dx is None else callers_kind(self._dense(ctx, dx), dL_doutput)

    def backward_backward_input(self, ctx: Context, dL_ddLdinput, dL_doutput, mode: str = "overwrite"):
        """Second order, tcnn's contract: for ``L2 = <dL_ddLdinput, dL/dinput>``, with ``dL/dinput`` the input
        gradient that ``backward(ctx, dL_doutput)`` returns, ``(dL2/d(dL_doutput), dL2/dinput)`` of shapes
        ``(batch, n_output_dims)`` and ``(batch, n_input_dims)`` (``(n_instances, batch, ...)`` for a dense
        batch); dL2/dparams is written to the parameter gradients (``mode="accumulate"``: added)."""
        g = self._output_gradient(ctx, dL_doutput, mode)
        v = as_batch(dL_ddLdinput, self.n_input_dims, "dL_ddLdinput", allow_dense=ctx.batch.dense is not None)
        v = ctx.batch.ops.rows(v)
        if v.shape[0] != ctx.x.shape[0]:
            raise ValueError(f"dL_ddLdinput has {v.shape[0]} samples, the forward pass had {ctx.x.shape[0]}")
        dy, dx = self._backward_backward_input(ctx, v, g, self._gradient_mode(ctx, mode))
        dx = ctx.batch.ops.full_like(ctx.x, 0.0) if dx is None else dx
        return (self._finish(dy, ctx.batch, dL_ddLdinput),
                callers_kind(self._dense(ctx, dx), dL_ddLdinput))

    def _output_gradient(self, ctx: Context, dL_doutput, mode: str) -> np.ndarray:
        """Check a backward call's context, mode and output gradient; the gradient as ``(batch, n_output_dims)``
        (the padded outputs get none: components read the first ``n_output_dims`` columns)."""
        self._check_runtime()
        self._check_context(ctx)
        if mode not in GRADIENT_MODES:
            raise ValueError(f"mode must be one of {GRADIENT_MODES}, got {mode!r}")
        batch = ctx.batch
        g = batch.ops.rows(as_batch(dL_doutput, self.n_output_dims, "dL_doutput", allow_dense=batch.dense is not None))
        if g.shape[0] != batch.size:
            raise ValueError(f"dL_doutput has {g.shape[0]} samples, the forward pass had {batch.size}")
        return g

    def _check_context(self, ctx):
        """``ValueError`` unless ``ctx`` is a context this object's forward made."""
        if not isinstance(ctx, Context) or ctx.owner is not self:
            raise ValueError("ctx must be the context returned by this object's forward()")

    def _gradient_mode(self, ctx: Context, mode: str) -> bool:
        """Whether the components overwrite the parameter gradients: a batch that reached every network
        overwrites all of them, and so does a device batch (on the device path every component's overwrite
        covers every network of an array, so a routed batch's counts need not be known on the host);
        otherwise the idle ones become 0 here and the components add."""
        overwrite = mode == "overwrite" and (ctx.batch.reaches_all or ctx.batch.on_device)
        if mode == "overwrite" and not overwrite:
            self._zero_gradients()
        return overwrite

    @staticmethod
    def _dense(ctx: Context, a: np.ndarray) -> np.ndarray:
        """A per-sample result in the batch's own layout (``(n_instances, batch, n)`` for a dense batch)."""
        dense = ctx.batch.dense
        return ctx.batch.ops.unflatten(a, dense) if dense else a

    def _dense_needs_sort(self) -> bool:
        """Whether this object's device training step of a dense ``(K, B_k, dims)`` batch reads the samples sorted
        into tiles (``batch.routing.tiles``: the per-layer MLP kernels' weight gradients; not the fused kernels, whose
        block k owns network k's samples)."""
        return True

    def _sorts_routed(self) -> bool:
        """Whether this object's device inference of a routed batch reads the samples sorted into tiles of one
        network (``batch.routing.tiles``: the fused MLP kernels); its census then sorts them in the same launch."""
        return False

    # -- implemented by components (batches of the call's one kind in and out: numpy on the host path,
    #    ``ti.ndarray`` on the device path; ``batch.ops`` has the operations on them) --
    def _floats_per_sample(self, training: bool) -> int:
        """Floats of batch-sized arrays a pass holds per sample (the input, the output and what ``ctx``
        keeps for backward): what sizes chunks (:func:`chunk_samples`)."""
        return self.n_input_dims + self.padded_output_width

    def _inference(self, x: np.ndarray, batch: Batch) -> np.ndarray:
        return self._forward(x, batch)[0]

    def _forward(self, x: np.ndarray, batch: Batch):
        """``(y, ctx)`` for this component's checked input ``x`` of the call's ``batch``; ``y`` has at least ``n_output_dims`` columns
        (an MLP computes no padded outputs; the caller reads the first ``n_output_dims``)."""
        raise NotImplementedError

    def _backward(self, ctx: Context, dL_dy: np.ndarray, input_gradient: bool, overwrite: bool = False):
        """Add the parameter gradients of the batch (write them if ``overwrite``: only asked when the
        batch reached every network); return ``dL/dx`` if ``input_gradient``, else ``None``."""
        raise NotImplementedError

    def _input_gradient(self, ctx: Context, dL_dy: np.ndarray):
        """``dL/dx`` alone, every parameter gradient left as it is (tcnn's ``GradientMode::Ignore``): the forward
        of ``tinn.ad.gradient_stage``. A component with parameters gives its own; one without has none to leave."""
        if self.n_params:
            raise TypeError(f"{type(self).__name__} holds parameters: it must give its own _input_gradient")
        return self._backward(ctx, dL_dy, True)

    def _backward_backward_input(self, ctx: Context, dL_ddLdx: np.ndarray, dL_dy: np.ndarray, overwrite: bool):
        """For ``L2 = <dL_ddLdx, dL/dx>`` (``dL_ddLdx`` is ``(batch, n_input_dims)``, ``dL_dy`` is
        ``(batch, n_output_dims)``): add (``overwrite``: write) dL2/dparams to the gradients and return ``(dL2/d(dL_dy), dL2/dx)``,
        the first at least ``n_output_dims`` wide, the second ``None`` where it is 0."""
        raise NotImplementedError(f"{type(self).__name__} has no second-order backward")
