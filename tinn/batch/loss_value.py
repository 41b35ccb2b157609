"""A loss that stays on the device until it is read (``LossValue``) and its per-network values (``PerNetwork``):
what a training step of device batches returns."""
import numpy as np

from .census import N_ACTIVE


class LossValue:
    """A loss that stays on the device until it is read: ``float(loss)``, formatting, comparisons and arithmetic
    read it (one wait for the device, then kept). ``sums``: the ``(K,)`` per-network sums of the loss kernel,
    averaged as ``routing.mean`` says. With a ``census`` (a trainer's step), reading it first settles the
    trainer's faults (an earlier bad step raises its ``ValueError`` here), then raises if this step's batch
    was bad."""

    def __init__(self, sums, routing, census=None):
        self._sums, self._routing, self._census = sums, routing, census
        self._value = self._per_network = None

    def _read(self) -> float:
        if self._value is None:
            census, n_active = self._census, None
            if census is not None:
                if census.faults is not None:
                    census.faults.settle(census.n_instances)
                census.check()
                n_active = int(census.read()[0][N_ACTIVE])
            sums = self._sums.to_numpy().astype(np.float64)
            self._value, self._per_network = self._routing.mean(sums, n_active), sums
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
