"""What one call carries: a :class:`Batch`, made once where a call enters tinn, its checks, and the seams where
results go back to the caller's kind.

Batches cross the public API as row-major ``(batch, dims)`` float32 arrays: numpy arrays, ``ti.ndarray`` arrays
or torch tensors. The public entry points (``DifferentiableObject.inference`` / ``forward``, ``Loss.evaluate``, a
``Trainer``'s steps, ``tinn.ad``'s stages) check their arguments (:func:`as_batch`: shape, dtype, finite values)
and turn them into one ``Batch``: its input as a flat ``(size, dims)`` array, the operations of its kind (``ops``:
``HOST`` for numpy, ``DEVICE`` for ``ti.ndarray``, :func:`ops_of`), its layout (``dense``), how it reaches a network
array's networks (``routing``), the device census that checks its values on the device (``census``) and a training
step's ``target`` and ``pdf``. A public method checks, makes the ``Batch`` and hands it to the same private method a
trainer's step calls; a ``Batch`` is never a public argument, so nothing below asks what was checked. Components take it and
dispatch one way: ``batch.ops.empty_like(x)``, ``batch.routing.tiles``; none asks what kind an array is.
:func:`check_ids` is the one rule for a network array's per-sample ids (their range: ``routing.check_id_range``),
:func:`as_mask` for an optimizer step's networks, :func:`check_out` for an ``out`` argument.

Results go back to the caller's kind here (:func:`callers_kind`, :func:`callers_output`, :func:`callers_loss`).
Taichi has no empty ndarray, so a ``(batch, 0)`` result is numpy whatever the path.
"""
import numpy as np
import taichi as ti

from ..runtime.program import active, check_live
from .buffers import buffer
from .census import Census, Request
from .faults import bad_value
from .ops import DEVICE, HOST, ndarray_view, to_numpy
from .routing import Routing, check_id_range, device_ids


class Batch:
    """One call's batch: ``x`` ``(size, dims)`` (flat: a dense ``(K, B_k, dims)`` batch flattened network by
    network), ``routing`` (:class:`~tinn.batch.routing.Routing`), ``ops`` (its kind's operations), ``census``
    (:class:`~tinn.batch.census.Census` of a device batch whose values and ids are checked on the device, or
    ``None``) and, for a training step, its ``target`` and ``pdf`` ``(size, D)`` (flat too; ``None`` where the call
    has none). Every array was checked where the batch was made (:meth:`of`): the private methods it is handed to
    check nothing again. Read-only facts, set once: ``size`` (samples), ``dense`` (``(K, B_k)`` when the batch came
    as a dense ``(K, B_k, dims)`` array, else ``None``: flat) and ``on_device`` (``ops`` is ``DEVICE``: its
    components run Taichi kernels on it)."""

    def __init__(self, x, routing: Routing, ops, *, census: Census | None = None, target=None, pdf=None):
        self.x, self.routing, self.ops, self.census, self.target, self.pdf = x, routing, ops, census, target, pdf
        self.size, self.dense, self.on_device = routing.batch, routing.dense, ops is DEVICE

    @classmethod
    def of(cls, x, instance, n_instances: int | None, *, census: Request | None = None, target=None,
           pdf=None) -> "Batch":
        """The batch of a checked array ``x`` (:func:`as_batch`): ``instance`` ids (checked here),
        or none for a dense ``(n_instances, B_k, dims)`` batch, which is flattened network by network.
        ``n_instances=None`` (a loss's routed batch): the largest id + 1. ``target`` and ``pdf``: a training
        step's, checked (shapes and dtypes; their values too unless the census checks them), of ``x``'s layout.

        ``census`` (:class:`~tinn.batch.census.Request`): a device batch described by a census on the device, which
        checks ``x``, ``target``, ``pdf`` and device ids there, not here (a training step's; an inference's is
        ``final`` and writes its ``faults`` itself). A host batch ignores it."""
        ops = ops_of(x)                         # the batch's kind, told here once
        if census is not None and ops is DEVICE:
            batch = cls._described(x, instance, n_instances, census, target, pdf)
        elif len(x.shape) == 2:                 # a numpy array or a ti.ndarray
            if ops is DEVICE and ops_of(instance) is DEVICE:
                ids, n_instances, counts = device_ids(check_device_ids(instance, x.shape[0]), n_instances)
                batch = cls(x, Routing(x.shape[0], n_instances, ids, counts=counts), ops)
            else:
                if n_instances is None:
                    n_instances = int(np.max(to_numpy(instance, "instance"))) + 1
                ids = as_instances(instance, x.shape[0], n_instances)
                batch = cls(x, Routing(x.shape[0], n_instances, ids), ops)
        else:
            if x.shape[0] != n_instances:
                raise ValueError(f"a dense batch needs shape ({n_instances}, batch, {x.shape[-1]}), "
                                 f"got {tuple(x.shape)}")
            k, b = x.shape[:2]
            batch = cls(ops.flatten(x), Routing(k * b, k, ops.dense_ids(k, b), (k, b)), ops)
        if target is not None:                  # (flat, as the loss reads them)
            batch.target, batch.pdf = ops.rows(target), None if pdf is None else ops.rows(pdf)
        return batch

    @classmethod
    def _described(cls, x, instance, n_instances: int, request: Request, target, pdf) -> "Batch":
        """:meth:`of` for a device batch whose values and ids a census checks on the device."""
        dense = None
        if len(x.shape) == 3:
            if x.shape[0] != n_instances:
                raise ValueError(f"a dense batch needs shape ({n_instances}, batch, {x.shape[-1]}), got {tuple(x.shape)}")
            dense, ids = tuple(x.shape[:2]), DEVICE.dense_ids(*x.shape[:2])
        elif instance is None:
            ids = None
            if n_instances != 1:
                as_instances(None, x.shape[0], n_instances)          # the error: an array needs ids
        elif ops_of(instance) is DEVICE:
            ids = check_device_ids(instance, x.shape[0])
        else:
            ids = DEVICE.put_ids(as_instances(instance, x.shape[0], n_instances))
        census = Census(x, ids, n_instances, request, target, pdf)
        routing = Routing(census.x.shape[0], n_instances, census.ids, dense, described=census)
        return cls(census.x, routing, DEVICE, census=census)

    def kernel_ids(self):
        """``(ids, routed)`` for a kernel over the batch: of the batch's kind (``ti.ndarray`` for a device
        batch), a one-element placeholder for a single network's batch."""
        if not self.routing.routed:
            return self.ops.no_ids(), False
        return (self.routing.ids if self.on_device else self.routing.instance), True

    @property
    def reaches_all(self) -> bool:
        """Whether the batch is known to reach every network (a single network, a dense batch, or host counts
        without a zero); a routed device batch's counts stay on the device, so it is not known there."""
        routing = self.routing
        if not routing.routed or routing.dense is not None:
            return True
        return self.census is None and bool(routing.counts.all())

    @property
    def step_mask(self):
        """What the optimizer steps: a census's device mask (the networks with samples, none if the batch was
        bad), else the host ids of the networks with samples (``None``: all of them)."""
        return self.routing.active if self.census is None else self.census.mask

    def chunk(self, lo: int, hi: int) -> "Batch":
        """Samples ``lo:hi`` of this host batch (its ``target`` and ``pdf`` too), a batch of their own that is part
        of this one (the loss normalises them by the whole batch's counts)."""
        def part(a):
            return None if a is None else a[lo:hi]
        return Batch(self.x[lo:hi], self.routing.chunk(lo, hi), self.ops, target=part(self.target),
                     pdf=part(self.pdf))


# -- the checks of a call's arguments ------------------------------------------------------------------
def is_device(a) -> bool:
    """Whether ``a`` is a ``ti.ndarray`` (the one place that asks)."""
    return isinstance(a, ti.Ndarray)


def ops_of(*arrays):
    """The operations for these batches: ``DEVICE`` if any is a ``ti.ndarray``, else ``HOST``."""
    return DEVICE if any(isinstance(a, ti.Ndarray) for a in arrays) else HOST


def _dtype_name(a) -> str:
    return {ti.f32: "float32", ti.i32: "int32"}.get(a.dtype, str(a.dtype)) if is_device(a) \
        else str(a.dtype)


def check_array(a, name: str, dtype, shapes: str, fits):
    """``TypeError`` unless ``a`` (numpy or ``ti.ndarray``) has ``dtype``; ``ValueError`` unless
    ``fits(shape)`` (``shapes`` says what fits) and the batch has a sample."""
    if _dtype_name(a) != np.dtype(dtype).name:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {_dtype_name(a)} "
                        f"(convert with .astype(np.{np.dtype(dtype).name}))")
    shape = tuple(a.shape)
    if not fits(shape):
        raise ValueError(f"{name} must have shape {shapes}, got {shape}")
    if 0 in shape[:-1]:                           # (batch, 0) is fine: an Empty encoding's output
        raise ValueError(f"{name} is an empty batch; a batch needs at least one sample")


def as_batch(a, n_dims, name: str = "x", *, dtype=np.float32, allow_dense: bool = False, finite: bool = False,
             positive: bool = False, deferred: bool = False):
    """Check a ``(batch, n_dims)`` array and return it ready for the components, of the path's one kind: a
    ``ti.ndarray`` on the device path (a host array checked on the host, then uploaded once), a contiguous
    numpy array on the host path. Inside a call every batch then has one kind, ``Batch.ops``.

    ``n_dims=None`` accepts any width. With ``allow_dense`` a ``(K, batch_k, n_dims)`` array is accepted
    too and returned unchanged in shape (the caller flattens it). ``finite`` rejects NaN and +-Inf,
    ``positive`` also values <= 0 (:func:`check_values`); with ``deferred`` the values of a batch that stays
    on the device are left to the census kernel that reads it first (a training step's, an inference's).
    """
    if is_device(a):
        check_live(a, name)
    if not isinstance(a, np.ndarray) and not (is_device(a) and active() and len(a.shape) in (2, 3)):
        a = to_numpy(a, name)                     # the host path (a ti.ndarray read in place on x64)
    width = n_dims or "dims"
    shapes = f"(batch, {width})" + (f" or (n_instances, batch, {width})" if allow_dense else "")
    check_array(a, name, dtype, shapes,
                lambda s: len(s) in ((2, 3) if allow_dense else (2,)) and (n_dims is None or s[-1] == n_dims))
    ops = ops_of(a)
    a = ops.contiguous(a)
    if (finite or positive) and not (deferred and ops is DEVICE):
        check_values(a, name, positive=positive, ops=ops)
    return DEVICE.adopt(a) if ops is HOST and a.shape[-1] and active() else a   # (no empty ndarray)


def check_values(a, name: str, *, positive: bool = False, ops=HOST):
    """``ValueError`` naming the first row of a batch (of ``ops``' kind) that holds NaN or +-Inf (or, with
    ``positive``, a value <= 0). ``ops.has_bad`` decides; only a failing batch is searched for its row,
    on the host."""
    if not a.shape[-1] or not ops.has_bad(a, positive):
        return
    arr = ops.host(a)
    rows = arr.reshape(-1, arr.shape[-1])
    bad = ~np.isfinite(rows)
    if positive:
        bad |= ~(rows > 0)
    first = int(np.flatnonzero(bad.any(axis=1))[0])
    raise bad_value(name, positive, first, arr.shape[1] if arr.ndim == 3 else 0, rows[first][bad[first]][0])


def check_ids(ids, batch: int, name: str = "instance"):
    """``TypeError`` / ``ValueError`` unless ``ids`` (numpy or ``ti.ndarray``) is int32 of shape ``(batch,)``."""
    check_array(ids, name, np.int32, f"({batch},)", lambda s: s == (batch,))


def check_device_ids(instance, batch: int):
    """A device ``instance`` array's kind, dtype and shape, as :func:`as_instances` checks numpy ones (its values are
    checked on the device)."""
    check_live(instance, "instance")
    check_ids(instance, batch)
    return instance


def as_instances(instance, batch: int, n_instances: int) -> np.ndarray | None:
    """Check the per-sample routing array ``instance`` (int32, shape ``(batch,)``, ids in
    ``[0, n_instances)``) and return it as a contiguous numpy array."""
    if instance is None:
        if n_instances != 1:
            raise ValueError(f"this object holds {n_instances} networks: pass instance=(batch,) int32 ids "
                             "or a dense (n_instances, batch, dims) array")
        return None
    arr = to_numpy(instance, "instance")
    check_ids(arr, batch)
    check_id_range(int(arr.min()), int(arr.max()), n_instances)
    return np.ascontiguousarray(arr)


def check_out(out, caller, shape: tuple) -> bool:
    """An ``out`` argument: float32, ``shape``, C-contiguous and of the kind of the array the caller passed
    (``TypeError`` / ``ValueError``). Returns whether it is a device buffer (which a device batch's last
    kernel can write)."""
    if is_device(caller) != is_device(out) or not (is_device(out) or isinstance(out, np.ndarray)):
        raise TypeError(f"out must be of x's kind ({type(caller).__name__}), got {type(out).__name__}")
    if _dtype_name(out) != "float32":
        raise TypeError(f"out must have dtype float32, got {out.dtype}")
    if tuple(out.shape) != shape:
        raise ValueError(f"out must have shape {shape}, got {tuple(out.shape)}")
    if not is_device(out) and not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    return is_device(out)


def as_mask(active, n_instances: int, kernel_array=lambda mask: mask):
    """The ``active`` argument of an optimizer step as the int32 ``(n_instances,)`` mask its kernels read (1: step
    that network): an int32 ``ti.ndarray`` mask as it is (its kind, dtype and shape checked; its values are read
    on the device), else host network ids (``None``: every network) as a host mask handed to ``kernel_array``
    (an optimizer's upload of its small tables). ``ValueError`` for anything else."""
    if is_device(active):
        check_live(active, "active")
        if active.dtype != ti.i32 or tuple(active.shape) != (n_instances,):
            raise ValueError(f"a device 'active' must be an int32 mask of shape ({n_instances},), "
                             f"got {active.dtype} {tuple(active.shape)}")
        return active
    if active is None:
        return kernel_array(np.ones(n_instances, np.int32))
    ids = np.asarray(active)
    if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)) or (
            ids.size and (ids.min() < 0 or ids.max() >= n_instances)):
        raise ValueError(f"active must be a list of network ids in [0, {n_instances}), got {active!r}")
    mask = np.zeros(n_instances, np.int32)
    mask[ids.astype(np.int64)] = 1
    return kernel_array(mask)


# -- the seams back to the caller's kind ---------------------------------------------------------------
def callers_kind(a, caller):
    """A result ``a`` as the kind of array the caller passed (``caller``): the one seam where results change
    kind. A numpy (or torch) caller gets numpy (a device result downloaded once); a ``ti.ndarray`` caller gets
    a ``ti.ndarray`` (the host path's numpy results written through a view of the new ndarray's memory on
    x64, uploaded elsewhere)."""
    if a is None or not is_device(caller):
        return a if a is None else HOST.adopt(a)
    if is_device(a) or not a.size:
        return a                                  # (an empty result stays numpy: Taichi has no empty ndarray)
    out = buffer(a.shape)
    view = ndarray_view(out)
    if view is None:
        out.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    else:
        view[...] = a
    return out


def callers_output(y, n_cols: int, dense, caller):
    """The first ``n_cols`` columns of a batch's result ``y`` (``(batch, width)``, a component's output) in the
    layout of a ``dense`` ``(K, B_k)`` batch (``None``: flat), of the caller's kind: a device result for a
    ``ti.ndarray`` caller stays on the device (a wider one's first columns copied there); anything else is read
    on the host once, then has the caller's kind (:func:`callers_kind`)."""
    if is_device(y) and is_device(caller) and n_cols:
        y = y if y.shape[1] == n_cols else DEVICE.columns(y, 0, n_cols)
        return DEVICE.unflatten(y, dense) if dense else y
    y = np.ascontiguousarray(host(y)[:, :n_cols])
    return callers_kind(y.reshape(dense + (-1,)) if dense else y, caller)


def callers_loss(loss, per_network, caller):
    """A loss and its per-network losses as the caller of a loss or a step gets them: numbers (a float and a
    numpy array) for a host ``caller``; for a ``ti.ndarray`` caller as they are (on the device path read
    when someone reads them, ``tinn.batch.loss_value.LossValue``)."""
    if is_device(caller):
        return loss, per_network
    return float(loss), np.asarray(per_network)


def host(a) -> np.ndarray:
    """A numpy array of any batch ``a`` (a download for a ``ti.ndarray``): for callers that read results."""
    return ops_of(a).host(a)
