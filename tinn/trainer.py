"""The trainer (tcnn ``trainer.h``): forward, loss, backward and optimizer step.

``training_step(x, target)`` returns the loss as a float. It checks its arguments once, into one ``Batch``
(``x``, ``target``, ``pdf``, the ids, and for device batches the census that checks their values on the device),
then composes the components' private methods, which check nothing again, in tcnn's ``Trainer::training_step``
order::

    batch = self._batch(x, target, instance, pdf)        # every check of the step, here
    y, ctx = model._forward(batch.x, batch)
    loss, dL_dy, _ = loss._evaluate(y, batch.target, batch.pdf, batch, loss_scale)
    model._backward(ctx, dL_dy, False, overwrite)        # overwrites the gradients (0 for idle networks)
    commit(optimizer._bound_phases(loss_scale, batch.step_mask))   # whole or not at all; idle networks not stepped

(the public ``model.forward``, ``loss.evaluate``, ``model.backward`` and ``optimizer.step`` check their
arguments, make their own ``Batch`` and call the same private methods).

The pieces are also available separately: ``forward(x, target) -> ctx`` (``ctx.loss``,
``ctx.dL_doutput``), ``backward(ctx)`` and ``optimizer_step(active=None)``, which steps the
networks it is given (all of them by default). With a network array, pass ``instance`` (or
a dense ``(K, B_k, dims)`` batch). A float32 model (the default) trains with loss scale 1. A model of
``precision="float16"`` trains as tcnn's half-precision build: float32 master weights for the optimizer
(``params_full_precision()``) and a dynamic loss scale (``loss_scaler``, a ``tinn.mixed_precision.LossScale``:
a step with a gradient beyond float16's range is skipped and the scale lowered; ``loss_scale`` is its value).
Its parameters and inference weights are float16, its gradients float32 (``tinn.params.DTYPES``).

Every argument is checked before any kernel runs: shapes, dtypes, and values (``x``, ``target``
and ``pdf`` finite, ``pdf > 0``; a ``ValueError`` names the argument and the first bad row),
so a rejected step leaves the model and the optimizer exactly as they were.

A step of device batches (``ti.ndarray``s on the device path) never waits for the device: its values and
network ids are checked there, by the step's census kernel (``tinn.batch.census``), and the loss it
returns is a :class:`~tinn.batch.loss_value.LossValue` read when someone reads it (``float(loss)``). A step whose
batch holds NaN or +-Inf (or a ``pdf`` <= 0, or an id out of range) skips its update on the device: every
parameter and all optimizer state stay as they were (the gradients hold what the bad batch gave). Its
``ValueError`` comes when that step's loss is read, or at the trainer's next call that reads from the device
(reading any later step's loss, ``per_instance=True``, ``params()``, ``params_inference()``, ``save``,
``load``, ``export_tcnn``, ``load_tcnn``, ``forward``), whichever comes first.

A network whose gradients (divided by the loss scale) hold a NaN, an Inf or a value beyond
``tinn.optimizers.step.GRADIENT_BOUND`` is not stepped: its parameters and optimizer state stay as they were, the
other networks step, and ``skipped_updates()`` counts it (on the device; nothing is read back during the step).

If the optimizer keeps separate inference weights (tcnn's ``custom_weights``: EMA,
Average, Lookahead, Composite with one of those), ``model.inference()`` reads them.

Checkpoints (see ``tinn.serialization``): ``save(path)`` / ``load(path)`` write and
restore everything needed to resume training bit-identically (configs, training and
inference weights, optimizer state) in one pickle-free ``.npz`` file;
``export_tcnn(path)`` / ``load_tcnn(path)`` exchange weights with tcnn through its
``Trainer::serialize()`` JSON snapshot.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from . import serialization, tcnn_snapshot
from .batch.batch import Batch, as_batch, callers_loss
from .batch.census import Request
from .batch.faults import Faults
from .mixed_precision import LossScale, MasterWeights
from .object import MIN_CHUNK, Context, DifferentiableObject, chunk_samples
from .runtime.commit import commit
from .runtime.program import RuntimeBound


class Trainer(RuntimeBound):
    """Trains ``model`` (a :class:`DifferentiableObject`, usually a ``NetworkWithInputEncoding``) with
    ``optimizer`` on ``loss``; ``seed`` re-initialises the model's parameters first.

    The optimizer is allocated for the model's parameters here (tcnn's ``Trainer`` constructor); for a
    float16 model, for float32 master weights of them (module docstring).
    """

    def __init__(self, model: DifferentiableObject, optimizer, loss, *, seed: int | None = None):
        self._bind_runtime()
        self.model, self.optimizer, self.loss = model, optimizer, loss
        if seed is not None:
            model.reset_params(seed)
        store = model.store
        half = store.precision == "float16"
        self._masters = MasterWeights(store) if half else None
        self.loss_scaler = LossScale() if half else None
        optimizer.allocate(model.n_params, model.layer_sizes(), model.n_instances, self.master_store)
        self._faults = Faults()                     # the record of a bad step of device batches

    @property
    def loss_scale(self) -> float:
        """The factor on the loss's gradients (and the optimizer's divisor): 1 in float32, else ``loss_scaler``'s."""
        return 1.0 if self.loss_scaler is None else self.loss_scaler.scale

    @property
    def master_store(self):
        """The store the optimizer steps: the model's own, or for a float16 model its float32 master weights."""
        return self.model.store if self._masters is None else self._masters.store

    def __repr__(self):
        m, opt = self.model, self.optimizer.hyperparams()
        parts = [f"{m.n_input_dims} -> {m.n_output_dims}", f"n_params={m.n_params}"]
        if m.n_instances > 1:
            parts.append(f"n_instances={m.n_instances}")
        hp = m.hyperparams()
        if "encoding" in hp and "network" in hp:
            parts.insert(0, f"{hp['encoding']['otype']} + {hp['network']['otype']}")
        lr = f"(learning_rate={opt['learning_rate']:g})" if "learning_rate" in opt else ""
        return (f"Trainer(model={type(m).__name__}({', '.join(parts)}), optimizer={opt['otype']}{lr}, "
                f"loss={self.loss.otype})")

    def hyperparams(self) -> dict:
        """``{"otype": "Trainer", "optimizer": {...}, "loss": {...}}`` (the model has its own)."""
        return {"otype": "Trainer", "optimizer": self.optimizer.hyperparams(), "loss": self.loss.hyperparams()}

    def update_hyperparams(self, config: dict):
        """Change optimizer and loss keys between steps, e.g. ``{"optimizer": {"learning_rate": 1e-4}}``.

        A top-level ``learning_rate`` acts as tcnn's ``set_learning_rate`` on every
        optimizer (wrappers forward it; ExponentialDecay sets ``base = value / factor``;
        Composite treats it as a factor on its nested rates).
        """
        if not isinstance(config, dict):
            raise TypeError(f"trainer hyperparameters must be a dict, got {type(config).__name__}")
        unknown = set(config) - {"otype", "optimizer", "loss"}
        if unknown:
            raise ValueError(f"Trainer.update_hyperparams: unknown sections {sorted(unknown)} "
                             "(valid: 'optimizer', 'loss')")
        if "loss" in config:                        # (losses have no keys: it only checks)
            self.loss.update_hyperparams(config["loss"])
        if "optimizer" in config:                   # every value checked, then all changed at one commit point
            self.optimizer.update_hyperparams(config["optimizer"])

    @property
    def n_params(self) -> int:
        return self.model.n_params

    def _settle(self):
        """Raise the ``ValueError`` of a bad step of device batches not yet reported (module docstring), then that of
        an inference of the model's not yet reported."""
        self._faults.settle(self.model.n_instances)
        self.model._settle()

    def params(self) -> np.ndarray:
        """The training parameters (tcnn's ``params()``), as ``model.params()``."""
        self._check_runtime()
        self._settle()
        return self.model.params()

    def _master(self):
        """:attr:`master_store`, a float16 model's masters brought up to its weights if they were set since."""
        if self._masters is not None:
            self._masters.sync()
        return self.master_store

    def _published(self):
        """After the master weights were written: a float16 model's weights rounded from them."""
        if self._masters is not None:
            self._masters.publish()

    def _parts(self) -> serialization.Parts:
        """What a checkpoint or a tcnn snapshot reads and writes (the runtime checked, pending faults raised)."""
        self._check_runtime()
        self._settle()
        return serialization.Parts(self.model, self.optimizer, self.loss, self.loss_scaler, self._master(),
                                   self._published)

    def params_full_precision(self) -> np.ndarray:
        """The float32 weights the optimizer steps (tcnn's ``params_full_precision()``): the master weights of a
        float16 model, else ``params()``."""
        self._check_runtime()
        self._settle()
        if self._masters is None:
            return self.model.params()
        store = self._master()
        values = store.read(store.params, store.offset, self.model.n_params)
        return values[0] if self.model.n_instances == 1 else values

    def params_inference(self) -> np.ndarray:
        """The weights ``inference()`` reads (tcnn's ``params_inference()``)."""
        self._check_runtime()
        self._settle()
        store = self.model.store
        values = store.read(store.inference_params, store.offset, self.model.n_params)
        return values[0] if self.model.n_instances == 1 else values

    # -- checkpoints -------------------------------------------------------------------
    def save(self, path):
        """Write configs, parameters and optimizer state to one ``.npz`` file at ``path``."""
        serialization.save(self._parts(), path)

    def load(self, path):
        """Restore a :meth:`save` checkpoint; a bad or mismatched file raises ``ValueError``
        and leaves the trainer unchanged."""
        serialization.load(self._parts(), path)

    def export_tcnn(self, path, instance: int | None = None):
        """Write tcnn's snapshot JSON (``n_params``, ``params_type``, ``params_binary``) of one network."""
        tcnn_snapshot.export_tcnn(self._parts(), path, instance)

    def load_tcnn(self, source, instance: int | None = None):
        """Load one network's parameters from a tcnn snapshot JSON (a path or the parsed dict)."""
        tcnn_snapshot.load_tcnn(self._parts(), source, instance)

    def forward(self, x, target, instance=None, pdf=None) -> Context:
        """Model forward and loss: the model's context, with ``loss``, ``dL_doutput`` and
        ``instance_losses`` (per network, ``(n_instances,)``) added. Checks every value first (on the device a
        read-back)."""
        self._settle()
        ctx = self._forward(self._batch(x, target, instance, pdf, deferred=False))
        ctx.loss, ctx.instance_losses = callers_loss(ctx.loss, ctx.instance_losses, x)
        ctx.instance_losses = np.asarray(ctx.instance_losses)
        return ctx

    def _batch(self, x, target, instance, pdf, deferred: bool, reuse: bool = False) -> Batch:
        """The step's :class:`~tinn.batch.batch.Batch` (``x``, ``target``, ``pdf``, the ids), its arguments checked
        once, before anything runs: the one place that says what a step checks (shapes and dtypes; the values of
        host arrays and, unless ``deferred``, of device ones: see the module docstring), of the path's kind (for
        device batches a census's, which checks them on the device; ``reuse``: the census's step-only arrays are
        the trainer's, kept from step to step). The private methods the step composes check nothing again."""
        self._check_runtime()
        model = self.model
        dense = model.n_instances > 1 and instance is None      # a (K, B_k, dims) batch

        def checked(a, n_dims, name, **values):
            return as_batch(a, n_dims, name, allow_dense=dense, deferred=deferred, **values)

        x = checked(x, model.n_input_dims, "x", finite=True)
        target = checked(target, model.n_output_dims, "target", finite=True)
        if target.shape[:-1] != x.shape[:-1]:
            raise ValueError(f"target has {_samples(target)} samples, x has {_samples(x)}")
        self.loss._check_width(target.shape[-1])
        if pdf is not None:
            pdf = checked(pdf, model.n_output_dims, "pdf", positive=True)
            if pdf.shape != target.shape:
                raise ValueError(f"pdf must have the target's shape {tuple(target.shape)}, got {tuple(pdf.shape)}")
        sort = len(x.shape) == 2 or model._dense_needs_sort()           # (for device batches only)
        census = Request(model.n_output_dims, self._faults, reuse, sort=sort)
        return Batch.of(x, instance, model.n_instances, census=census, target=target, pdf=pdf)

    def _forward(self, batch: Batch) -> Context:
        """Forward and loss of the step's checked ``batch``: the model's context with ``loss``, ``dL_doutput``
        (flat, of the batch's kind) and ``instance_losses`` added."""
        model = self.model
        model._settle()                             # (an earlier inference of a bad device batch)
        y, ctx = model._forward(batch.x, batch)
        if y.shape[1] != model.n_output_dims:       # (a padded output: the loss reads the model's own columns)
            y = batch.ops.columns(y, 0, model.n_output_dims)
        ctx.loss, ctx.dL_doutput, ctx.instance_losses = self.loss._evaluate(y, batch.target, batch.pdf, batch,
                                                                            self.loss_scale)
        return ctx

    def backward(self, ctx: Context):
        """Parameter gradients of ``ctx.loss``, overwriting the previous ones (networks of an array that
        got no samples get 0)."""
        self._check_runtime()
        self.model._check_context(ctx)
        self._backward(ctx)

    def _backward(self, ctx: Context, mode: str = "overwrite"):
        """The model's backward of the step's ``ctx`` (``mode``: tcnn's gradient mode)."""
        model = self.model
        model._backward(ctx, ctx.dL_doutput, False, model._gradient_mode(ctx, mode))

    def optimizer_step(self, active=None):
        """Apply the gradients: step the networks ``active`` (ids of an array's networks, or an int32
        ``ti.ndarray`` mask ``(n_instances,)``), or all of them. The optimizer was bound to the model at
        construction; it checks ``active``. The step is whole or not taken (``tinn.runtime.commit.commit``)."""
        self._check_runtime()
        self._optimizer_step(active)

    def _optimizer_step(self, active):
        """The optimizer's bound step (its phases, committed whole) of the bound store: a float16 model's masters,
        unless its loss scale skips it."""
        if self._masters is None:
            commit(self.optimizer._bound_phases(1.0, active))
            return
        self._masters.sync()
        scale = self.loss_scale                     # the scale the gradients carry
        overflow = self._masters.read_gradients()
        phases = [partial(self.loss_scaler.record, overflow)]
        if not overflow:
            phases += self.optimizer._bound_phases(scale, active) + [self._masters.publish]
        commit(phases)

    def skipped_updates(self) -> np.ndarray:
        """Per network, the steps whose update was not applied because a gradient (divided by the loss scale) was NaN,
        +-Inf or beyond ``tinn.optimizers.step.GRADIENT_BOUND``: int64 ``(n_instances,)``, counted on the device
        since the trainer was made (a read-back). The network's parameters and optimizer state stayed as they were.
        A float16 model's overflowing steps are counted by ``loss_scaler.skipped`` instead."""
        self._check_runtime()
        return self.optimizer.skipped_updates()

    def training_step(self, x, target, instance=None, pdf=None, *, per_instance: bool = False):
        """One step; returns the loss, or ``(loss, per-network losses)`` with ``per_instance=True``.

        A batch larger than :func:`tinn.object.chunk_samples` allows is processed in chunks (gradients
        accumulated over the chunks, each sample normalised by the whole batch, then one
        optimizer step), so the step's memory stays bounded whatever the batch size. A step of ``ti.ndarray``
        batches on the device path reads nothing back and returns the loss unread (module docstring); for host
        arrays it is a float.
        """
        batch = self._batch(x, target, instance, pdf, deferred=True, reuse=True)
        if batch.on_device or batch.size <= MIN_CHUNK or batch.size <= chunk_samples(self.model, training=True):
            ctx = self._forward(batch)                  # one pass (a device batch is never cut)
            self._backward(ctx)
            loss, losses = ctx.loss, ctx.instance_losses
        else:
            loss, losses = self._chunked_gradients(batch)
        self._optimizer_step(batch.step_mask)
        loss, losses = callers_loss(loss, losses, x)
        return (loss, np.asarray(losses)) if per_instance else loss

    def _chunked_gradients(self, whole: Batch):
        """``(loss, per-network losses)`` of a large host batch, its gradients accumulated chunk by chunk into the
        model's (the first chunk overwrites them)."""
        loss, losses, chunk = 0.0, 0.0, chunk_samples(self.model, training=True)
        for lo in range(0, whole.size, chunk):
            ctx = self._forward(whole.chunk(lo, min(lo + chunk, whole.size)))
            self._backward(ctx, "overwrite" if lo == 0 else "accumulate")
            loss, losses = loss + ctx.loss, losses + ctx.instance_losses
        return loss, losses


def _samples(batch: np.ndarray) -> str:
    return " x ".join(str(n) for n in batch.shape[:-1])
