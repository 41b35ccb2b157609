"""Moving parameters and gradients between torch tensors and a native object's parameter store.

Where the store allows it (Taichi's x64 backend, a large enough store: ``ParamStore.rows_view``), the
copies are plain memory copies into and out of the store's own fields; elsewhere they go through the
native ``set_params`` / ``gradients``. The store's inference weights (what ``inference()`` reads; tinn's
optimizers fill them after each step) are filled from the training weights only when an inference call
needs them (:func:`publish_inference`).
"""
import numpy as np


def _view(native, field):
    return native.store.rows_view(field, native._offset, native.n_params,
                                  np.arange(native.n_instances, dtype=np.int32))


def write_params(native, values: np.ndarray):
    """Set the native object's training weights to ``values`` (float32, shaped as ``native.params()``)."""
    view = _view(native, native.store.params) if native.n_params else None
    if view is None:
        native.set_params(values)
    else:
        np.copyto(view, values.reshape(view.shape))


def publish_inference(native):
    """Make the native object's inference weights equal its training weights."""
    if native.n_params:
        native.store.publish(native.store.params, native._offset, np.ones(native.n_instances, np.int32))


def read_gradients(native) -> np.ndarray:
    """A copy of the native object's parameter gradients, shaped as ``native.params()``."""
    view = _view(native, native.store.grads) if native.n_params else None
    if view is None:
        return np.asarray(native.gradients())
    return np.array(view[0] if native.n_instances == 1 else view)
