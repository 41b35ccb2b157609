"""What one call carries: a :class:`Batch`, made once where a call enters tinn.

The public entry points (``DifferentiableObject.inference`` / ``forward``, ``Loss.evaluate``, a ``Trainer``'s
steps, ``tinn.ad``'s stages) check their arguments (``tinn.batch.kind``) and turn them into one ``Batch``:
its input as a flat ``(size, dims)`` array, the operations of its kind (``ops``: ``HOST`` for numpy, ``DEVICE``
for ``ti.ndarray``), its layout (``dense``), how it reaches a network array's networks (``routing``), the
device census that checks its values on the device (``census``) and which of its arrays were checked
(``checked``). Components take it and dispatch one way: ``batch.ops.empty_like(x)``, ``batch.routing.tiles``.
"""
import numpy as np

from .census import Census
from .host_ops import to_numpy
from .kind import DEVICE, as_instances, ops_of
from .routing import Routing, check_device_ids, device_ids


class Batch:
    """One call's batch: ``x`` ``(size, dims)`` (flat: a dense ``(K, B_k, dims)`` batch flattened network by
    network), ``routing`` (:class:`~tinn.batch.routing.Routing`), ``ops`` (its kind's operations), ``census``
    (:class:`~tinn.batch.census.Census` of a device batch whose values and ids are checked on the device, or
    ``None``) and ``checked`` (the arrays whose values were checked: the calls a trainer composes check none
    again). Read-only facts, set once: ``size`` (samples), ``dense`` (``(K, B_k)`` when the batch came as a dense
    ``(K, B_k, dims)`` array, else ``None``: flat) and ``on_device`` (``ops`` is ``DEVICE``: its components run
    Taichi kernels on it)."""

    def __init__(self, x, routing: Routing, ops, *, census: Census | None = None, checked: tuple = ()):
        self.x, self.routing, self.ops, self.census, self.checked = x, routing, ops, census, checked
        self.size, self.dense, self.on_device = routing.batch, routing.dense, ops is DEVICE

    @classmethod
    def of(cls, x, instance, n_instances: int | None, *, checked: tuple = (), census: tuple | None = None) -> "Batch":
        """The batch of a checked array ``x`` (``tinn.batch.kind.as_batch``): ``instance`` ids (checked here),
        or none for a dense ``(n_instances, B_k, dims)`` batch, which is flattened network by network.
        ``n_instances=None`` (a loss's routed batch): the largest id + 1. ``checked``: arrays of the call whose
        values were checked (``x`` is added when it is flattened).

        ``census=(n_target_dims, faults, reuse, False, sort, target, pdf)``: a training step's device batch, described
        by a census on the device, which checks ``x``, ``target``, ``pdf`` and device ids there, not here (``reuse``:
        see :class:`~tinn.batch.census.Census`);
        ``census=(1, faults, True, True, sort)``: an inference's, whose census writes ``faults`` itself (``final``)
        and sorts the samples into tiles only if ``sort`` (else when ``tiles`` is first asked for)."""
        ops = ops_of(x)                         # the batch's kind, told here once
        if census is not None and ops is DEVICE:
            return cls._described(x, instance, n_instances, checked, *census)
        if len(x.shape) == 2:                   # a numpy array or a ti.ndarray
            if ops is DEVICE and ops_of(instance) is DEVICE:
                ids, n_instances, counts = device_ids(instance, x.shape[0], n_instances)
                return cls(x, Routing(x.shape[0], n_instances, ids, counts=counts), ops, checked=checked)
            if n_instances is None:
                n_instances = int(np.max(to_numpy(instance, "instance"))) + 1
            ids = as_instances(instance, x.shape[0], n_instances)
            return cls(x, Routing(x.shape[0], n_instances, ids), ops, checked=checked)
        if x.shape[0] != n_instances:
            raise ValueError(f"a dense batch needs shape ({n_instances}, batch, {x.shape[-1]}), got {tuple(x.shape)}")
        k, b = x.shape[:2]
        flat = ops.flatten(x)
        return cls(flat, Routing(k * b, k, ops.dense_ids(k, b), (k, b)), ops, checked=_also(checked, x, flat))

    @classmethod
    def _described(cls, x, instance, n_instances: int, checked: tuple, n_dims: int, faults, reuse: bool,
                   final: bool = False, sort: bool = True, target=None, pdf=None) -> "Batch":
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
        census = Census(x, ids, n_instances, n_dims, faults, reuse, sort=sort, final=final, target=target, pdf=pdf)
        routing = Routing(census.x.shape[0], n_instances, census.ids, dense, described=census)
        return cls(census.x, routing, DEVICE, census=census, checked=_also(checked, x, census.x))

    def trusting(self, *arrays) -> "Batch":
        """This batch with ``arrays`` added to the checked ones (a new value; this one is unchanged): what a trainer
        hands on with the model's output and the loss's gradient, which tinn made."""
        return Batch(self.x, self.routing, self.ops, census=self.census, checked=self.checked + arrays)

    def has_checked(self, a) -> bool:
        """Whether ``a`` is one of the arrays whose values were checked for this batch (``checked``)."""
        return any(a is c for c in self.checked)

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

    def chunk(self, lo: int, hi: int, checked: tuple = ()) -> "Batch":
        """Samples ``lo:hi`` of this host batch, a batch of their own that is part of this one (the loss
        normalises them by the whole batch's counts); ``checked``: the chunk's other checked arrays (its
        input is checked if this batch's was)."""
        x = self.x[lo:hi]
        mine = (x,) if self.has_checked(self.x) else ()
        return Batch(x, self.routing.chunk(lo, hi), self.ops, checked=mine + tuple(checked))


def _also(checked: tuple, x, flat) -> tuple:
    """``checked`` with the flat copy ``flat`` of ``x`` added if ``x`` was checked."""
    return checked + (flat,) if any(x is c for c in checked) else checked
