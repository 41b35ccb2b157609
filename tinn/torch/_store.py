"""Moving parameters and gradients between torch tensors and a native object's parameter store.

The routes are :mod:`tinn.torch._tensors`'. On ``DIRECT`` (the device path where torch holds Taichi's
memory) the store's rows are written from, and its gradient rows read into, the torch tensor itself by
one copy kernel each. Otherwise the tensor goes through numpy: where the store allows it (Taichi's x64
backend, a large enough store: ``ParamStore.rows_view``) as plain memory copies into and out of the
store's own fields, elsewhere through the native ``set_params`` / ``gradients``. The store's inference
weights (what ``inference()`` reads; tinn's optimizers fill them after each step) are filled from the
training weights only when an inference call needs them (:func:`publish_inference`).
"""
import numpy as np
import torch

from ..runtime.kernels import rows_copy
from ._tensors import DIRECT, route


def _view(native, field):
    return native.store.rows_view(field, native._offset, native.n_params,
                                  np.arange(native.n_instances, dtype=np.int32))


def _rows(native, field, values: torch.Tensor, mode: int):
    """``rows_copy`` between the native object's columns of ``field`` (every instance) and ``values``,
    ``(n_instances, n_params)`` float32 on Taichi's device: mode 0 reads into ``values``, 1 writes them."""
    rows = torch.arange(native.n_instances, dtype=torch.int32, device=values.device)
    rows_copy(field, native._offset, rows, values, mode)


def write_params(native, params: torch.Tensor):
    """Set the native object's training weights to ``params`` (any floating dtype and device, shaped as
    ``native.params()``: ``(n_params,)``, or ``(n_instances, n_params)`` for an array)."""
    if not native.n_params:
        return
    how, device = route()
    values = params.detach().to(device, torch.float32)
    if how == DIRECT:
        _rows(native, native.store.params, values.reshape(native.n_instances, native.n_params).contiguous(), 1)
        return
    values = values.numpy()
    view = _view(native, native.store.params)
    if view is None:
        native.set_params(values)
    else:
        np.copyto(view, values.reshape(view.shape))


def publish_inference(native):
    """Make the native object's inference weights equal its training weights."""
    if native.n_params:
        native.store.publish(native.store.params, native._offset, np.ones(native.n_instances, np.int32))


def read_gradients(native, like: torch.Tensor) -> torch.Tensor:
    """A copy of the native object's parameter gradients, shaped, typed and placed as ``like`` (the module's
    ``params``)."""
    how, device = route()
    if not native.n_params:
        grads = torch.zeros(like.shape, dtype=torch.float32)
    elif how == DIRECT:
        grads = torch.empty((native.n_instances, native.n_params), dtype=torch.float32, device=device)
        _rows(native, native.store.grads, grads, 0)
    else:
        view = _view(native, native.store.grads)
        grads = torch.from_numpy(np.asarray(native.gradients()) if view is None else
                                 np.array(view[0] if native.n_instances == 1 else view))
    return grads.reshape(like.shape).to(like.device, like.dtype)
