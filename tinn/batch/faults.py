"""A bad batch, reported: what a check finds, the one message for it whichever path found it, and when a device
call's fault reaches the caller. Everything about reporting a bad batch is here.

* **Host batches** are checked on the host before anything runs: ``tinn.batch.batch.check_values`` raises
  :func:`bad_value`'s ``ValueError`` at once (a NaN or +-Inf, a ``pdf`` <= 0), ``as_instances`` an id out of range.
* **Device batches** are checked on the device by their census (``tinn.batch.census``), which must not make a step
  wait. It leaves its findings in ``facts`` (int32, the slots below: the first bad row of ``x``, ``target`` and
  ``pdf``, the ids' range, the networks with samples) and ``values`` (the first bad value of each row), and a
  deferred call's census writes the first bad call into a fault record (:class:`Faults`, by :func:`record_fault`).
  A bad training step's update is skipped on the device (its step mask is 0 for every network).

A deferred call's ``ValueError`` (:func:`raise_for`, the host check's message with the call named) is raised in
one of three places, whichever comes first:

1. reading a training step's loss (``tinn.batch.loss_value.LossValue``): :func:`report`, the trainer's earlier bad
   step first, then this step's census;
2. a trainer's reads from the device (``Trainer._settle``: ``params()``, ``save``, ``forward``, ...): its
   :class:`Faults`;
3. an object's reads (``ParametricObject._settle``: ``params()``, ``forward``, an inference of host arrays): the
   :class:`Faults` of its device inferences.
"""
import numpy as np
import taichi as ti

from ..runtime.types import F32_1D, I32_1D
from . import buffers as _buffers

X_ROW, TARGET_ROW, PDF_ROW, ID_LO, ID_HI, N_ACTIVE = range(6)
"""Slots of a census's ``facts`` (int32): the first bad row of each array, the ids' range, the networks with samples."""

N_FACTS = 6
NONE = 2 ** 31 - 1
"""A first bad row of an array that has none."""

NAMES = {X_ROW: "x", TARGET_ROW: "target", PDF_ROW: "pdf"}

RECORD_FACTS = 3
"""Where a fault record's copy of the bad call's ``facts`` starts (:class:`Faults`: a flag, the call's number and a
dense batch's samples per network come first)."""

TRAINING_STEP = "training step {} of this trainer's device batches, whose update was skipped"
"""How a trainer's :class:`Faults` name the bad step in the ``ValueError``."""


Record = ti.types.argpack(record=I32_1D, values=F32_1D)
"""A :class:`Faults`' record of a bad call, as the census kernel takes it."""


@ti.func
def bad(facts: ti.template(), n_instances) -> ti.i32:
    """Whether a census's ``facts`` name anything wrong (a bad row in x, target or pdf; an id out of range)."""
    out = facts[X_ROW] != NONE or facts[TARGET_ROW] != NONE or facts[PDF_ROW] != NONE
    if facts[ID_LO] != NONE or facts[ID_HI] != -NONE - 1:           # a routed batch
        out = out or facts[ID_LO] < 0 or facts[ID_HI] >= n_instances
    return out


@ti.func
def record_fault(facts: ti.template(), values: ti.template(), n_instances, record: ti.template(), call, per_network):
    """Write a bad batch's ``facts`` and ``values`` into a fault record (``record``: a :class:`Faults`' ``record``
    and ``values``) as call number ``call`` (``per_network``: a dense batch's samples per network, else 0), unless
    the record holds an earlier one."""
    if bad(facts, n_instances) and record.record[0] == 0:
        record.record[0], record.record[1], record.record[2] = 1, call, per_network
        for i in ti.static(range(N_FACTS)):
            record.record[RECORD_FACTS + i], record.values[i] = facts[i], values[i]


def bad_value(name: str, positive: bool, row: int, per_network: int, value, when: str = "") -> ValueError:
    """The one message for a batch's first bad row ``row`` (of the flat batch; ``(k, b)`` for a dense one of
    ``per_network`` samples per network, else 0), whichever path found it; ``when``: the deferred call."""
    rule = "finite and > 0" if positive else "finite"
    where = divmod(row, per_network) if per_network else row
    return ValueError(f"{name} must be {rule}: row {where} holds {value}{when}")


def raise_for(facts: np.ndarray, values: np.ndarray, n_instances: int, when: str, per_network: int = 0):
    """The ``ValueError`` the host check would have raised for these ``facts`` (a census's, or a fault record's)."""
    for slot in (X_ROW, TARGET_ROW, PDF_ROW):
        if facts[slot] != NONE:
            raise bad_value(NAMES[slot], slot == PDF_ROW, int(facts[slot]), per_network, values[slot], when)
    lo, hi = int(facts[ID_LO]), int(facts[ID_HI])
    if (lo != NONE or hi != -NONE - 1) and (lo < 0 or hi >= n_instances):
        raise ValueError(f"instance ids must lie in [0, {n_instances}), got values in [{lo}, {hi}]{when}")


def report(census) -> int:
    """What reading a training step's loss reports first: the ``ValueError`` of the trainer's earlier bad step not yet
    reported, then that of this step's ``census`` (:class:`~tinn.batch.census.Census`); else the networks that got
    samples (one read-back of the census's findings)."""
    if census.faults is not None:
        census.faults.settle(census.n_instances)
    facts, values = census.read()
    raise_for(facts, values, census.n_instances, "", census.per_network)
    return int(facts[N_ACTIVE])


class Faults:
    """A record of the first deferred call whose device batch was bad (a census found NaN or +-Inf, a ``pdf`` <= 0,
    or an id out of range), written by that call's census: a trainer's (a bad training step) or an object's (a bad
    inference); on the device, read by :meth:`settle`. ``step`` counts the deferred calls (each census is told its
    call's number); ``event`` names one in the ``ValueError`` (``{}``: its number). It also keeps the census arrays
    that only a call's own kernels read, from call to call (:meth:`kept`)."""

    def __init__(self, event: str = TRAINING_STEP):
        self.record, self.values = _buffers.buffer((RECORD_FACTS + N_FACTS,), ti.i32), _buffers.buffer((N_FACTS,))
        self.step, self._settled, self.event = 0, 0, event
        self._kept = {}
        self.pack = Record(record=self.record, values=self.values)      # (for the census kernel)

    def kept(self, key, make):
        """What ``make()`` made for ``key``, kept for this record's calls (a census's arrays that only its call's
        kernels read, and their argument packs, whose creation allocates)."""
        if key not in self._kept:
            if len(self._kept) > 32:                    # batch shapes changed often: start afresh
                self._kept.clear()
            self._kept[key] = make()
        return self._kept[key]

    def next_step(self) -> int:
        self.step += 1
        return self.step

    def settle(self, n_instances: int):
        """``ValueError`` for the first bad call since the last settle, if any (a read-back only when deferred
        calls ran since then); the record is then cleared, so each fault is raised once here."""
        if self._settled == self.step:
            return
        self._settled = self.step
        record = self.record.to_numpy()
        if record[0]:
            values = self.values.to_numpy()
            self.record.fill(0)
            raise_for(record[RECORD_FACTS:], values, n_instances, f" (in {self.event.format(int(record[1]))})",
                      int(record[2]))
