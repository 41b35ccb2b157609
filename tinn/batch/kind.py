"""The kind of a batch, told once: :func:`ops_of` gives the operations of a batch's kind (``HOST`` for
numpy, ``DEVICE`` for ``ti.ndarray``), and the few seams where a result changes kind for its caller.

A call's batches get their kind once (``tinn.batch.checks.as_batch``) and its
:class:`~tinn.batch.batch.Batch` carries the operations (``batch.ops``): components call
``batch.ops.empty_like(x)``, ``batch.ops.columns(...)`` and so on; none asks what kind an array is. Results
go back to the caller's kind here (:func:`callers_kind`, :func:`callers_output`, :func:`callers_loss`). Taichi has no empty ndarray, so a ``(batch, 0)`` result is
numpy whatever the path.
"""
import numpy as np
import taichi as ti

from .buffers import buffer
from .device_ops import DEVICE
from .host_ops import HOST, ndarray_view

__all__ = ["DEVICE", "HOST", "callers_kind", "callers_loss", "callers_output", "host", "is_device", "ops_of"]


def is_device(a) -> bool:
    """Whether ``a`` is a ``ti.ndarray`` (the one place that asks)."""
    return isinstance(a, ti.Ndarray)


def ops_of(*arrays):
    """The operations for these batches: ``DEVICE`` if any is a ``ti.ndarray``, else ``HOST``."""
    return DEVICE if any(isinstance(a, ti.Ndarray) for a in arrays) else HOST


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
