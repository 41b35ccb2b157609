"""The loss of a batch per network: where the loss kernel leaves its values and how they become the batch's loss
(:class:`HostSums`, :class:`DeviceSums`), and a loss that stays on the device until it is read (:class:`LossValue`,
its per-network values :class:`PerNetwork`): what a training step of device batches returns.

A network array's loss normalises each network's samples by that network's own count (``1 / (B_k D)``), and the
batch's loss is the mean over the networks that got samples; a single network's is its mean per-element loss."""
import numpy as np
import taichi as ti

from . import buffers as _buffers
from .faults import report
from .ops import DEVICE, HOST


def normalisers(routing, n_dims: int) -> np.ndarray:
    """Per network, the ``1 / (B_k * n_dims)`` its samples' losses are scaled by (0 for a network without samples),
    ``(n_instances,)`` float32 (a chunk's are the whole batch's): the host's rule; :func:`normaliser` is its
    device twin (a census writes a step's), and ``tests/test_losses.py`` holds them equal."""
    whole = routing.whole
    counts = whole.counts if routing.routed and routing.dense is None else \
        np.full(routing.n_instances, whole.batch // routing.n_instances)
    inv = np.zeros(routing.n_instances, np.float32)
    np.divide(1.0, counts * n_dims, out=inv, where=counts > 0, casting="unsafe")
    return inv


@ti.func
def normaliser(count, n_dims) -> ti.f32:
    """The device twin of :func:`normalisers`: ``1 / (count * n_dims)`` for a network of ``count`` samples, 0 for
    one without (the census's step job writes it into ``Census.inv``)."""
    return ti.select(count > 0, 1.0 / ti.cast(count * n_dims, ti.f32), 0.0)


def mean(routing, per_network: np.ndarray, n_active: int | None = None) -> float:
    """The batch's loss from its per-network losses: a single network's own, the mean over a dense array's
    networks, or over the networks with samples of a routed one (``n_active`` of them: counted on the host
    unless given)."""
    if not routing.routed or routing.dense is not None:
        return float(per_network.mean())
    if n_active is None:
        n_active = int(np.count_nonzero(routing.whole.counts))
    return float(per_network.sum() / max(n_active, 1))


class HostSums:
    """A host batch's loss: the kernel leaves every sample's loss in ``rows`` ``(size,)``, summed here per network
    in float64."""

    def __init__(self, batch):
        self.routing = batch.routing

    def arrays(self, size: int, n_dims: int) -> tuple:
        """``(inv, rows, sums)`` for the loss kernel: the normalisers, and where it leaves the losses (``sums`` an
        unread placeholder)."""
        return normalisers(self.routing, n_dims), np.empty(size, np.float32), HOST.unused((1,), np.float32)

    def losses(self, rows, sums) -> tuple:
        """``(loss, per-network losses)``: a float and a float64 ``(n_instances,)`` array."""
        routing = self.routing
        if not routing.routed:
            per_network = np.array([rows.sum(dtype=np.float64)])
        elif routing.dense is not None:
            per_network = rows.reshape(routing.n_instances, -1).sum(axis=1, dtype=np.float64)
        else:
            per_network = np.bincount(routing.instance, weights=rows, minlength=routing.n_instances)
        return mean(routing, per_network), per_network


class DeviceSums:
    """A device batch's loss: the kernel sums each network's losses into ``sums`` ``(n_instances,)`` itself (one
    atomic add per run of one network's samples), and the loss is a :class:`LossValue`, read when someone reads
    it. A census's batch has its normalisers on the device."""

    def __init__(self, batch):
        self.routing, self.census = batch.routing, batch.census

    def arrays(self, size: int, n_dims: int) -> tuple:
        """``(inv, rows, sums)`` for the loss kernel: the normalisers (the census's), and where it leaves the losses
        (``rows`` an unread placeholder)."""
        inv = DEVICE.adopt(normalisers(self.routing, n_dims)) if self.census is None else self.census.inv
        return inv, DEVICE.unused((1,), np.float32), _buffers.buffer((self.routing.n_instances,))

    def losses(self, rows, sums) -> tuple:
        """``(loss, per-network losses)``: a :class:`LossValue` and its :class:`PerNetwork` (a census's batch, a
        trainer's step: reading the loss reports what that census found first)."""
        loss = LossValue(sums, self.routing, self.census)
        return loss, PerNetwork(loss)


def sums_of(batch):
    """The loss sums of ``batch``'s kind: :class:`DeviceSums` on the device, else :class:`HostSums`."""
    return DeviceSums(batch) if batch.on_device else HostSums(batch)


class LossValue:
    """A loss that stays on the device until it is read: ``float(loss)``, formatting, comparisons and arithmetic
    read it (one wait for the device, then kept). ``sums``: the ``(K,)`` per-network sums of the loss kernel,
    averaged as :func:`mean` says. With a ``census`` (a trainer's step), reading it first settles the
    trainer's faults (an earlier bad step raises its ``ValueError`` here), then raises if this step's batch
    was bad."""

    def __init__(self, sums, routing, census=None):
        self._sums, self._routing, self._census = sums, routing, census
        self._value = self._per_network = None

    def _read(self) -> float:
        if self._value is None:
            census, n_active = self._census, None
            if census is not None:
                n_active = report(census)          # (a bad batch's ValueError first: tinn.batch.faults)
            sums = self._sums.to_numpy().astype(np.float64)
            self._value, self._per_network = mean(self._routing, sums, n_active), sums
        return self._value

    @property
    def per_network(self) -> np.ndarray:
        """The ``(K,)`` float64 per-network losses (0 for networks without samples); reads the device."""
        self._read()
        return self._per_network

    def __float__(self):
        return self._read()

    def __int__(self):
        return int(self._read())

    def __bool__(self):
        return bool(self._read())

    def __format__(self, spec):
        return format(self._read(), spec)

    def __repr__(self):
        return repr(self._read()) if self._value is not None else "LossValue(on the device, not read yet)"

    def __str__(self):
        return str(self._read())

    def __hash__(self):
        return hash(self._read())

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._read(), dtype=dtype)

    def __round__(self, n=None):
        return round(self._read(), n)


class PerNetwork:
    """A step's ``(K,)`` per-network losses, read from the device when used as an array (``np.asarray``)."""

    def __init__(self, loss: LossValue):
        self._loss = loss

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._loss.per_network, dtype=dtype)

    def __len__(self):
        return len(self._loss.per_network)

    def __getitem__(self, index):
        return self._loss.per_network[index]

    def __repr__(self):
        return f"PerNetwork({np.asarray(self)!r})"


def _binary(name):
    def op(self, other):
        return getattr(self._read(), name)(float(other) if isinstance(other, LossValue) else other)
    op.__name__ = name
    return op


for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__radd__", "__sub__", "__rsub__",
              "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "__pow__", "__rpow__"):
    setattr(LossValue, _name, _binary(_name))
for _name in ("__neg__", "__pos__", "__abs__"):
    setattr(LossValue, _name, (lambda name: lambda self: getattr(self._read(), name)())(_name))
