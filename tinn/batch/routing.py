"""Network arrays: how a batch is spread over the networks of an array.

``Routing`` describes one batch, once: built when the batch enters a model
(``DifferentiableObject.forward`` / ``inference``), carried in the forward context, and
read by every component, the loss (per-network normalisation), the backward pass (which
networks' gradients a batch overwrites) and the optimizer (which networks step). A batch
is one of three kinds: for a single network (no ids), *routed* (a ``(B,)`` int32
``instance`` id per sample, in any order) or *dense* (``(K, B_k, dims)``: network k owns
the k-th run of ``B_k`` samples; a dense ``ti.ndarray`` is flattened by a copy on the device).

The host path sorts a routed batch by network into row blocks for the MLP's batched products
(``tinn.batch.groups.Groups``, made on first use: ``routing.groups``).

On the device path (``tinn.runtime.device``) a routed batch stays on the device: ``Routing.ids`` are the
ids as an int32 ``ti.ndarray`` (the caller's own, or uploaded once), ``counts`` are counted there
(``n_instances`` integers read back: the optimizer steps only networks that got samples), and
``Routing.tiles`` sorts the samples by network into *tiles* of at most ``TILE`` samples of one
network each, by kernels over the ids; the MLP reduces weight gradients and the loss sums
per-network losses one tile at a time. Within a network the order of the samples is that of the
device's atomic counters, so sums over them are not bit-identical run to run there (the device
path's gradient adds are atomic anyway).
"""

import functools

import numpy as np
import taichi as ti

from ..runtime.program import check_live
from ..runtime.types import I32_1D, I32_2D
from . import buffers as _buffers
from .census import TILE, Census, place, tile_row
from .checks import as_instances, check_id_range, check_ids
from .groups import Groups
from .host_ops import to_numpy
from .kind import DEVICE, HOST, ops_of
from .loss_value import LossValue, PerNetwork


@ti.kernel
def _id_census(ids: I32_1D, out: I32_1D):
    """``out[:K]`` the samples of each network (ids in [0, K) only), ``out[K]`` and ``out[K + 1]`` the smallest
    and largest id, for ``K = out.shape[0] - 2`` (``out`` zero-filled)."""
    K = out.shape[0] - 2
    out[K], out[K + 1] = 2 ** 31 - 1, -2 ** 31
    for b in range(ids.shape[0]):
        k = ids[b]
        ti.atomic_min(out[K], k)
        ti.atomic_max(out[K + 1], k)
        if 0 <= k < K:
            ti.atomic_add(out[k], 1)


@ti.kernel
def _sort_ids(ids: I32_1D, offsets: I32_2D, cursor: I32_1D, order: I32_1D, tiles: I32_2D):
    """The samples sorted by network (``order``) and cut into tiles (``tiles``), as the census's kernel does it."""
    for b in range(ids.shape[0]):
        place(ids, offsets, cursor, order, b)
    for t in range(tiles.shape[0]):
        tile_row(offsets, tiles, t)


def check_device_ids(instance, batch: int):
    """A device ``instance`` array's kind, dtype and shape, as :func:`~tinn.batch.checks.as_instances` checks numpy ones
    (its values are checked on the device)."""
    check_live(instance, "instance")
    check_ids(instance, batch)
    return instance


def device_ids(instance, batch: int, n_instances: int | None):
    """A device batch's ``(batch,)`` int32 ``ti.ndarray`` of ids checked as :func:`~tinn.batch.checks.as_instances`
    checks numpy ones, their range found on the device together with the samples of each network (one
    read-back of ``n_instances + 2`` integers); ``n_instances=None`` takes the largest id + 1 (the range is
    read first). Returns ``(ids, n_instances, counts)``, ``counts`` ``(n_instances,)`` int64."""
    check_device_ids(instance, batch)
    if n_instances is None:                     # a census of no networks: the range alone
        span = _buffers.buffer((2,), ti.i32)
        _id_census(instance, span)
        n_instances = max(int(span.to_numpy()[1]) + 1, 1)
    census = _buffers.buffer((n_instances + 2,), ti.i32)
    _id_census(instance, census)
    census = census.to_numpy().astype(np.int64)
    check_id_range(int(census[-2]), int(census[-1]), n_instances)
    return instance, n_instances, census[:-2]


class Routing:
    """The networks a batch of ``batch`` samples reaches, built once per batch.

    ``instance``: the ``(batch,)`` int32 network id of every sample (numpy, or on the device path
    a ``ti.ndarray``), or ``None`` for a single network; ``dense``: ``(K, B_k)`` when the batch came as ``(K, B_k, dims)``
    (then ``instance`` is ``k`` repeated ``B_k`` times). The derived facts are computed on
    first use and kept: ``counts`` (samples per network), ``active`` (the networks that got
    samples, ``None`` for all of them) and ``groups`` (the batch sorted by network).

    ``whole`` is the batch this one is a chunk of (itself if none): a large batch is processed
    in chunks, and the loss normalises every chunk's samples by the whole batch's counts.

    ``census``: a training step's device batch is described on the device only (:class:`~tinn.batch.census.Census`:
    its values and ids checked there, counts, tiles and the step's mask of networks), and nothing is read
    back; then ``instance`` is the census's ids clamped into range. ``checked``: the arrays of the batch (x,
    target, pdf) whose values a trainer checked (on the host, or by the census and the loss kernel on the
    device): the calls it composes do not check them again.
    """

    def __init__(self, batch: int, n_instances: int = 1, instance=None, dense=None,
                 whole: "Routing | None" = None, counts: np.ndarray | None = None, census: Census | None = None,
                 ops=HOST):
        self.batch, self.n_instances, self.instance, self.dense, self.ops = batch, n_instances, instance, dense, ops
        self._whole, self.census, self.checked = whole, census, ()
        if counts is not None:                  # found with the ids' range (device ids)
            self.counts = counts

    @property
    def whole(self) -> "Routing":
        """The batch this one is a chunk of, or itself (kept as ``None``: no reference cycle)."""
        return self if self._whole is None else self._whole

    @classmethod
    def of(cls, x: np.ndarray, instance, n_instances: int | None,
           census: tuple | None = None) -> tuple[np.ndarray, "Routing"]:
        """A checked batch ``x`` as ``(batch, dims)`` and its routing: ``instance`` ids (checked here), or
        none for a dense ``(n_instances, B_k, dims)`` batch, which is flattened network by network.
        ``n_instances=None`` (a loss's routed batch): the largest id + 1.

        ``census=(n_target_dims, faults, reuse)``: a training step's device batch, described by a census on the
        device (device ids are then checked there too, not here; ``reuse``: see :class:`~tinn.batch.census.Census`);
        ``census=(1, faults, True, True, sort)``: an inference's, whose census writes ``faults`` itself (``final``)
        and sorts the samples into tiles only if ``sort`` (else when ``tiles`` is first asked for)."""
        ops = ops_of(x)                         # the batch's kind, told here once and carried as routing.ops
        if census is not None and ops is DEVICE:
            return cls._described(x, instance, n_instances, *census)
        if len(x.shape) == 2:                   # a numpy array or a ti.ndarray
            if ops is DEVICE and ops_of(instance) is DEVICE:
                ids, n_instances, counts = device_ids(instance, x.shape[0], n_instances)
                return x, cls(x.shape[0], n_instances, ids, counts=counts, ops=ops)
            if n_instances is None:
                n_instances = int(np.max(to_numpy(instance, "instance"))) + 1
            return x, cls(x.shape[0], n_instances, as_instances(instance, x.shape[0], n_instances), ops=ops)
        if x.shape[0] != n_instances:
            raise ValueError(f"a dense batch needs shape ({n_instances}, batch, {x.shape[-1]}), got {x.shape}")
        k, b = x.shape[:2]
        return ops.flatten(x), cls(k * b, k, ops.dense_ids(k, b), (k, b), ops=ops)

    @classmethod
    def _described(cls, x, instance, n_instances: int, n_dims: int, faults, reuse: bool, final: bool = False,
                   sort: bool = True) -> tuple:
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
        census = Census(x, ids, n_instances, n_dims, faults, reuse, sort=sort, final=final)
        return census.x, cls(census.x.shape[0], n_instances, census.ids, dense, census=census, ops=DEVICE)

    @property
    def reaches_all(self) -> bool:
        """Whether the batch is known to reach every network (a single network, a dense batch, or host counts
        without a zero); a routed device batch's counts stay on the device, so it is not known there."""
        if self.instance is None or self.dense is not None:
            return True
        return self.census is None and bool(self.counts.all())

    @property
    def step_mask(self):
        """What the optimizer steps: a census's device mask (the networks with samples, none if the batch was
        bad), else the host ids of the networks with samples (``None``: all of them)."""
        return self.active if self.census is None else self.census.mask

    def normalisers(self, n_dims: int):
        """Per network, the ``1 / (B_k * n_dims)`` its samples' losses are scaled by, ``(n_instances,)`` float32 (a
        chunk's are the whole batch's): a census's, on the device, or a host array."""
        if self.census is not None:
            return self.census.inv
        whole = self.whole
        if self.routed and self.dense is None:
            with np.errstate(divide="ignore"):
                return (1.0 / (whole.counts * n_dims)).astype(np.float32)       # inf only where never read
        return np.full(self.n_instances, 1.0 / (whole.batch // self.n_instances * n_dims), np.float32)

    def sum_per_network(self, values: np.ndarray) -> np.ndarray:
        """Per network, the sum of a host ``(batch,)`` array over its samples: ``(n_instances,)`` float64."""
        if not self.routed:
            return np.array([values.sum(dtype=np.float64)])
        if self.dense is not None:
            return values.reshape(self.n_instances, -1).sum(axis=1, dtype=np.float64)
        return np.bincount(self.instance, weights=values, minlength=self.n_instances)

    def mean(self, per_network: np.ndarray, n_active: int | None = None) -> float:
        """The batch's loss from its per-network losses: a single network's own, the mean over a dense array's
        networks, or over the networks with samples of a routed one (``n_active`` of them: counted on the host
        unless given)."""
        if not self.routed or self.dense is not None:
            return float(per_network.mean())
        if n_active is None:
            n_active = int(np.count_nonzero(self.whole.counts))
        return float(per_network.sum() / max(n_active, 1))

    def loss_sums(self, batch: int) -> tuple:
        """``(rows, sums)``: where the loss kernel leaves the losses of a batch of ``batch`` samples, as the
        routing sums them per network. On the host every sample's loss in ``rows`` ``(batch,)``, summed per
        network in float64 by :meth:`network_losses`; on the device each network's sum in ``sums``
        ``(n_instances,)``, summed by the kernel itself (one atomic add per run of one network's samples). The
        other one is an unread placeholder."""
        if self.on_device:
            return self.ops.unused((1,), np.float32), _buffers.buffer((self.n_instances,))
        return np.empty(batch, np.float32), self.ops.unused((1,), np.float32)

    def network_losses(self, rows, sums, census: Census | None = None) -> tuple:
        """``(loss, per-network losses)`` from what the loss kernel left in :meth:`loss_sums`: a float and a float64
        ``(n_instances,)`` array on the host; on the device a :class:`~tinn.batch.loss_value.LossValue` (and its
        :class:`~tinn.batch.census.PerNetwork`), read when someone reads it (settling ``census`` first)."""
        if self.on_device:
            loss = LossValue(sums, self, census)
            return loss, PerNetwork(loss)
        per_network = self.sum_per_network(rows)
        return self.mean(per_network), per_network

    def has_checked(self, a) -> bool:
        """Whether ``a`` is one of the arrays whose values were checked for this batch (``checked``)."""
        return any(a is c for c in self.checked)

    def chunk(self, lo: int, hi: int) -> "Routing":
        """Samples ``lo:hi`` of this batch, as a routed batch of their own that is part of this one."""
        return Routing(hi - lo, self.n_instances, None if self.instance is None else self.instance[lo:hi],
                       whole=self, ops=self.ops)

    @property
    def on_device(self) -> bool:
        """Whether the batch is on the device (``ops`` is ``DEVICE``): its components run Taichi kernels on it."""
        return self.ops is DEVICE

    @property
    def routed(self) -> bool:
        """Whether samples carry network ids (a network array's batch)."""
        return self.instance is not None

    @functools.cached_property
    def counts(self) -> np.ndarray:
        """Samples per network, ``(n_instances,)`` int64."""
        if self.instance is None:
            return np.array([self.batch], np.int64)
        if self.dense is not None:
            return np.full(self.n_instances, self.dense[1], np.int64)
        if self.census is not None:                     # read back (a wait for the device)
            return self.census.counts.to_numpy().astype(np.int64)
        if ops_of(self.instance) is DEVICE:             # the caller's device ids, checked
            return device_ids(self.instance, self.batch, self.n_instances)[2]
        return np.bincount(self.instance, minlength=self.n_instances)

    @functools.cached_property
    def active(self) -> np.ndarray | None:
        """Ids (int32) of the networks that got samples; ``None`` when every network did."""
        if self.dense is not None or self.n_instances == 1 or self.counts.all():
            return None
        return np.flatnonzero(self.counts).astype(np.int32)

    @functools.cached_property
    def ids(self):
        """The ids as an int32 ``ti.ndarray`` (the device path): the caller's own, a dense batch's (made on the
        device once per shape), or uploaded once."""
        return DEVICE.put_ids(self.instance)

    def kernel_ids(self):
        """``(ids, routed)`` for a kernel over the batch: of the batch's kind (``ti.ndarray`` for a device
        batch), a one-element placeholder for a single network's batch."""
        if self.instance is None:
            return self.ops.no_ids(), False
        return (self.ids if self.on_device else self.instance), True

    @property
    def tiles(self) -> tuple:
        """``(table, order)`` on the device: ``order`` ``(batch,)`` the samples sorted by network, ``table``
        ``(n_tiles, 3)`` int32 rows ``(start, end, k)``: samples ``order[start:end]`` of network k, at most
        ``TILE`` of them (a network's tiles are consecutive). A census's tiles were made by its kernel (the
        table then ends in empty tiles ``(0, 0, 0)``)."""
        table, order, _ = self._sorted
        return table, order

    @property
    def runs(self) -> tuple:
        """``(order, offsets)`` on the device: the samples sorted by network and ``offsets`` ``(2, n_instances + 1)``
        int32, ``offsets[0, k]`` network k's first sorted position (``offsets[0, K]`` the batch), ``offsets[1, k]``
        its first tile of :attr:`tiles`."""
        _, order, offsets = self._sorted
        return order, offsets

    @functools.cached_property
    def _sorted(self) -> tuple:
        """``(table, order, offsets)``: built from the ids by kernels; the per-network offsets of samples and of
        tiles (``2 (n_instances + 1)`` integers) are uploaded at once."""
        if self.census is not None:
            return self.census.tiles, self.census.order, self.census.offsets
        counts = self.counts
        per = -(-counts // TILE)
        offsets = np.zeros((2, self.n_instances + 1), np.int32)     # first sample, first tile of each network
        offsets[0, 1:], offsets[1, 1:] = np.cumsum(counts), np.cumsum(per)
        offsets_d = _buffers.put(offsets, ti.i32)
        cursor = _buffers.buffer((self.n_instances,), ti.i32)
        order = _buffers.buffer((self.batch,), ti.i32)
        table = _buffers.buffer((int(offsets[1, -1]), 3), ti.i32)
        _sort_ids(self.ids, offsets_d, cursor, order, table)
        return table, order, offsets_d

    @functools.cached_property
    def groups(self) -> "Groups":
        """The batch grouped by network (for the host MLP's batched products)."""
        return Groups(self)
