"""One sample inside a user's Taichi kernel: the ``ti.func``s every differentiable object exposes.

A component supplies one hook, ``_sample_funcs(weights, grads) -> (forward, vjp)``:

* ``forward(x, k=0) -> y``: the padded-free output ``ti.Vector[n_output_dims]`` of network ``k``,
  reading the parameter field ``weights[k, offset + i]``;
* ``vjp(x, dL_dy, k=0) -> dL_dx``: the vector-Jacobian product ``J(x)^T dL_dy`` at the same weights,
  adding ``dL/dθ`` to ``grads[k, offset + i]`` atomically, or touching nothing if ``grads`` is ``None``.

From it :class:`SampleFuncs` builds the public funcs::

    func(x[, k])              y at the inference weights            (= inference())
    forward_func(x[, k])      y at the training weights             (= forward(), also under EMA/Average/Lookahead)
    backward_func(x, dy[, k]) dL/dx at the training weights, adds dL/dθ to the gradients (atomically)
    jacobian_func(x[, k])     (y, J) at the inference weights, J = dy/dx (n_output_dims x n_input_dims); no gradients

Compile time grows faster than linearly with the number of inlined call sites of a func in one
kernel (each call inlines the whole model). ``jacobian_func`` therefore calls the vjp from one
call site in a dynamic loop over the outputs, and a user kernel that evaluates a model at several
points should do the same (see docs/differentiable_programming.md).
"""
import taichi as ti

from .program import guarded


def jacobian_of(forward, vjp, n_in: int, n_out: int):
    """``ti.func (x, k=0) -> (y, J)``: y = forward(x, k) and row i of J = vjp(x, e_i, k), one vjp
    call site in a dynamic loop over the outputs."""

    @ti.func
    def jacobian_func(x, k=0):
        y = forward(x, k)
        J = ti.Matrix.zero(ti.f32, n_out, n_in)
        for i in range(n_out):
            e = ti.Vector.zero(ti.f32, n_out)
            e[i] = 1.0
            row = vjp(x, e, k)
            for d in ti.static(range(n_in)):
                J[i, d] = row[d]
        return y, J

    return jacobian_func


class SampleFuncs:
    """The per-sample ``ti.func``s of a :class:`~tinn.object.DifferentiableObject` (see the module doc).

    Funcs close over the parameter store's fields; they are built once per (weights, gradients) pair
    and rebuilt after the object is bound to another store."""

    def _sample_funcs(self, weights, grads):
        """``(forward, vjp)`` ``ti.func``s reading ``weights``; ``vjp`` adds dL/dθ to ``grads`` unless None."""
        raise NotImplementedError

    def _cached_funcs(self, kind: str):
        """The funcs of ``kind``, each checking first, when a user's kernel is compiled, that ``ti.init``
        has not been called again since this object was built (``RuntimeResetError``)."""
        self._check_runtime()
        cache = self.__dict__.setdefault("_sample_cache", {})
        store = self.store if self.n_params else None
        inference = store.inference_params if store is not None else None
        training = store.params if store is not None else None
        key = (kind, id(inference), id(training))
        if key not in cache:
            if kind in ("inference", "training", "backward"):
                weights = inference if kind == "inference" else training
                grads = store.grads if kind == "backward" and store is not None else None
                forward, vjp = self._sample_funcs(weights, grads)
                cache[key] = guarded(self, forward, 1), guarded(self, vjp, 2)
            else:
                forward, vjp = self._cached_funcs("inference")
                cache[key] = jacobian_of(forward, vjp, self.n_input_dims, self.n_output_dims)
        return cache[key]

    @property
    def func(self):
        """``ti.func (x: ti.Vector[n_input_dims], k=0) -> ti.Vector[n_output_dims]`` at the inference
        weights (equal to ``inference``); ``k`` is the network of an array."""
        return self._cached_funcs("inference")[0]

    @property
    def forward_func(self):
        """``ti.func (x, k=0) -> y`` at the training weights (equal to ``forward``, also while an
        EMA/Average/Lookahead optimizer gives ``inference`` other weights)."""
        return self._cached_funcs("training")[0]

    @property
    def backward_func(self):
        """``ti.func (x, dL_dy: ti.Vector[n_output_dims], k=0) -> dL_dx``: J(x)^T dL_dy at the training
        weights; adds dL/dθ to the parameter gradients (atomically: gradients accumulate over samples
        and calls, clear them with :meth:`zero_grad`)."""
        return self._cached_funcs("backward")[1]

    @property
    def jacobian_func(self):
        """``ti.func (x, k=0) -> (y, J)``: the output and its Jacobian ``J[i, d] = dy_i/dx_d``
        (``n_output_dims x n_input_dims``) at the inference weights; touches no gradients."""
        return self._cached_funcs("jacobian")

    def zero_grad(self):
        """Set this object's parameter gradients to 0 (funcs and ``backward(mode="accumulate")`` add to them)."""
        self._check_runtime()
        if not self.n_params:
            return
        if self.n_params == self.store.n_params:           # the whole store: one fill
            self.store.zero_grad()
        else:
            self._zero_gradients()
