"""``tinn.ad``: a tinn model as one stage of the user's differentiable Taichi program.

Taichi's reverse mode (``ti.ad.Tape``) differentiates the user's kernels; a tinn model enters it as a
stage with a hand-written backward (``ti.ad.grad_replaced``), so tinn's code is never differentiated
by Taichi and the parameter gradients go through the batch path (no per-sample weight atomics)::

    pts = ti.Vector.field(3, ti.f32, (R, S), needs_grad=True)        # the user's kernel A writes it
    raw = ti.Vector.field(1, ti.f32, (R, S), needs_grad=True)        # the stage writes it, kernel B reads
    density = tinn.ad.stage(model.network, pts, raw)

    model.network.zero_grad()                  # the Tape clears Taichi's .grad fields, never tinn's gradients
    with ti.ad.Tape(loss=loss):
        sample_points(); density(); composite(); loss_kernel()
    model.trainer.optimizer_step()             # or optimizer_step(active=density.active) for arrays

``stage(network, x, y)``: forward ``y[I] = network(x[I])``; reverse ``x.grad[I] += J(x[I])^T y.grad[I]``
and ``dθ += Σ_I (∂y[I]/∂θ)^T y.grad[I]`` (``network.backward(..., mode="accumulate")``).

``gradient_stage(network, x, g)`` for a network with one output f: forward ``g[I] = ∇ₓ f(x[I])`` (the batch
forward at the training weights and its input gradient, touching no parameter gradient); reverse
``x.grad[I] += H(x[I]) g.grad[I]`` and ``dθ += Σ_I ∂⟨g.grad[I], ∇ₓf(x[I])⟩/∂θ`` through the batch
``backward_backward_input(ctx, g.grad, 1, mode="accumulate")``: an Eikonal loss on ``g`` trains f.

Stages take Taichi Vector fields of one shape and index offset (any number of axes, float32) and optional int32
fields of that shape and offset: ``instance`` routes each element to its network of an array, ``mask`` leaves the
elements where it is 0 out (their outputs are 0 and they get no gradient). Elements are independent;
the reverse pass reads the inputs the forward pass saw. Calling a stage outside a Tape only runs the
forward. Each call inside a Tape has its own reverse pass (a stage may run several times per Tape,
on the same fields): like Taichi's reverse of a kernel that stores a field, it consumes the output's
``.grad`` and sets it to 0, and adds to ``x.grad``.

Moving elements between the fields and tinn's batches is ``tinn.batch.fields``'s (``HostMoves`` on the CPU,
``DeviceMoves`` on the device path, where nothing batch-sized leaves the device).
"""

import taichi as ti
from taichi.lang.field import ScalarField
from taichi.lang.matrix import MatrixField

from .batch.fields import DeviceMoves, HostMoves, index_offset
from .object import DifferentiableObject
from .runtime import program as _program


def _check_field(name, f, n, like=None, vector=True):
    kind = MatrixField if vector else ScalarField
    if not isinstance(f, kind) or (vector and f.m != 1):
        want = f"a ti.Vector.field of {n} components" if vector else "a scalar int32 ti.field"
        raise TypeError(f"{name} must be {want}, got {type(f).__name__}")
    _program.check_live(f, name)                     # (before its shape or dtype are read)
    if f.snode.ptr is None:
        raise ValueError(f"{name} is not placed: give it a shape, or place it (ti.root.dense(...).place(...)) first")
    if vector and f.n != n:
        raise ValueError(f"{name} must have {n} components (the network's dims), got {f.n}")
    if f.dtype != (ti.f32 if vector else ti.i32):
        raise TypeError(f"{name} must have dtype {'float32' if vector else 'int32'}, got {f.dtype}")
    if like is not None and (tuple(f.shape), index_offset(f)) != (tuple(like.shape), index_offset(like)):
        raise ValueError(f"{name} must have the shape and index offset of x, {tuple(like.shape)} and "
                         f"{index_offset(like)}, got {tuple(f.shape)} and {index_offset(f)}")


def _has_grad(f):
    ti.lang.impl.get_runtime().materialize()
    return f.snode.ptr.has_adjoint()


class _Call:
    """What one forward call keeps for its reverse pass: the elements it took (``taken``), the moves that took
    them and the forward context; ``done`` once the forward has finished (a reverse pass of a forward that an
    exception cut short, as ``ti.ad.Tape``'s exit runs while that exception unwinds, does nothing)."""
    ctx = taken = moves = None
    done = False


class _Stage:
    """A callable stage: ``stage()`` runs the forward (recorded by an enclosing ``ti.ad.Tape``). Each call
    picks its path's moves (``HostMoves`` on the CPU, ``DeviceMoves`` elsewhere, ``tinn.batch.fields``) and keeps them for its
    reverse pass."""

    out_name = "y"

    def __init__(self, network, x, out, instance=None, mask=None):
        if not isinstance(network, DifferentiableObject):
            raise TypeError(f"network must be a tinn model (a DifferentiableObject), got {type(network).__name__}")
        _check_field("x", x, network.n_input_dims)
        _check_field(self.out_name, out, self._out_dims(network), x)
        if not _has_grad(out):
            raise ValueError(f"{self.out_name} needs gradients: create it with needs_grad=True")
        if instance is None and network.n_instances > 1:
            raise ValueError(f"the network holds {network.n_instances} networks: pass an int32 instance field")
        if instance is not None:
            _check_field("instance", instance, 1, x, vector=False)
        if mask is not None:
            _check_field("mask", mask, 1, x, vector=False)
        self.network, self.x, self.out, self.instance, self.mask = network, x, out, instance, mask
        self._active, self._x_grad = None, _has_grad(x)
        launch = ti.ad.grad_replaced(self._forward_call)
        ti.ad.grad_for(launch)(self._backward_call)
        self._launch = launch

    def _forward_call(self, call):
        self._forward(call)
        call.done = True

    def _backward_call(self, call):
        if call.done:
            self._backward(call)

    def __call__(self):
        self._launch(_Call())

    @property
    def active(self):
        """The networks the last call reached, for ``trainer.optimizer_step(active=...)``: ``None`` for a single
        network; on the CPU their ids (int32), on the device path an int32 ``(n_instances,)`` ``ti.ndarray``
        mask (1: reached), which stays on the device."""
        return self._active

    def _take(self, call):
        call.moves = DeviceMoves if _program.active() else HostMoves
        call.taken = call.moves.take(self)
        self._active = call.taken.active

    def _add_input_gradient(self, call, dx):
        if dx is not None and self._x_grad:
            call.moves.add_gradient(self, call.taken, dx)


class Stage(_Stage):
    """``y[I] = network(x[I])`` with the batch forward; reverse through the batch backward."""

    @staticmethod
    def _out_dims(network):
        return network.n_output_dims

    def _forward(self, call):
        self._take(call)
        y = None
        if call.taken.n:
            y, call.ctx = call.moves.forward(self.network, call.taken)
        call.moves.put(self, call.taken, y)

    def _backward(self, call):
        dy = call.moves.take_gradient(self, call.taken)      # the output's .grad, then 0, as Taichi's reverse
        if call.ctx is None:                                 # of a kernel that stores a field does
            return
        dx = self.network.backward(call.ctx, dy, input_gradient=self._x_grad, mode="accumulate")
        self._add_input_gradient(call, dx)


class GradientStage(_Stage):
    """``g[I] = ∇ₓ f(x[I])`` of a one-output network: the batch forward and its input gradient, no parameter
    gradient touched; reverse through ``backward_backward_input`` on the forward's context."""

    out_name = "g"

    @staticmethod
    def _out_dims(network):
        if network.n_output_dims != 1:
            raise ValueError(f"gradient_stage needs a network with one output, got {network.n_output_dims}")
        return network.n_input_dims

    def _forward(self, call):
        self._take(call)
        g = None
        if call.taken.n:
            _, call.ctx = call.moves.forward(self.network, call.taken)
            g = self.network._input_gradient(call.ctx, call.moves.ones(call.taken.n))
        call.moves.put(self, call.taken, g)

    def _backward(self, call):
        dg = call.moves.take_gradient(self, call.taken)
        if call.ctx is None:
            return
        _, dx = self.network.backward_backward_input(call.ctx, dg, call.moves.ones(call.taken.n), mode="accumulate")
        self._add_input_gradient(call, dx)


def stage(network, x, y, instance=None, mask=None) -> Stage:
    """A ``ti.ad.Tape`` stage ``y[I] = network(x[I])`` (see the module doc)."""
    return Stage(network, x, y, instance, mask)


def gradient_stage(network, x, g, instance=None, mask=None) -> GradientStage:
    """A ``ti.ad.Tape`` stage ``g[I] = ∇ₓ network(x[I])`` of a one-output network (see the module doc)."""
    return GradientStage(network, x, g, instance, mask)
