"""Checkpoints: tinn's own, everything to resume training (tcnn's parameter snapshots: ``tcnn_snapshot``).

tinn checkpoint (``Trainer.save`` / ``Trainer.load``): one ``.npz`` archive (numpy's
zip of ``.npy`` files, no pickle) holding

* ``header`` — a uint8 array of UTF-8 JSON: ``format`` ("tinn-checkpoint"),
  ``version`` (1), ``n_instances``, ``n_params``, and the ``model``, ``loss`` and
  ``optimizer`` hyperparameters (full configs, defaults included);
* ``params`` — the training parameters, float32 ``(n_instances, n_params)`` (for a float16 model, the
  trainer's float32 master weights; the header then also holds ``precision`` ("float16") and the
  ``loss_scale`` state, ``{"scale", "good_steps", "skipped"}``);
* ``inference_params`` — the weights ``inference()`` reads (the optimizer's EMA /
  average / lookahead weights when it keeps them, else equal to ``params``);
* ``optimizer.<key>`` — every array of ``optimizer.state_dict()`` (nested optimizers'
  keys prefixed, step counters included).

Loading never unpickles and never reads a member before checking its declared size and
its ``.npy`` header against the trainer; it validates everything (see :func:`load`) and
only then writes; any problem is a ``ValueError`` that leaves the trainer bit-identical.
Hyperparameter values (learning rate, betas, ...) are taken from the file, so a trainer
changed with ``update_hyperparams`` resumes as saved.


Both this module and ``tcnn_snapshot`` are handed a trainer's :class:`Parts`, not the trainer.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import warnings
import zipfile

import numpy as np

from ._files import check_json_depth, open_regular, write_atomically
from .optimizers.step import STEP_LIMIT
from .registry import create_loss, create_optimizer

FORMAT, VERSION = "tinn-checkpoint", 1
_MAX_HEADER = 1 << 24
_MAX_HEADER_DEPTH = 100    # JSON nesting of a header (configs nest optimizers a few levels deep)
_NPY_SLACK = 4096          # bytes an .npy header may add to its data
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
MAX_STEPS = STEP_LIMIT     # step counters beyond 2^30 are refused (the kernels count in int32 and saturate)


@dataclasses.dataclass(frozen=True)
class Parts:
    """What checkpoints and snapshots read and write of a trainer: its ``model``, ``optimizer``, ``loss`` and
    ``loss_scaler`` (``None`` unless float16); ``master``, the store the optimizer steps (a float16 model's float32
    master weights, brought up to its weights), and ``publish()``, called after ``master``'s weights were written
    (a float16 model's own rounded from them)."""
    model: object
    optimizer: object
    loss: object
    loss_scaler: object
    master: object
    publish: object


def _canonical(obj):
    """A config as it reads back from JSON (tuples become lists, ...)."""
    return json.loads(json.dumps(obj))


def _otype_tree(cfg):
    """The optimizer structure a checkpoint's state depends on: otypes, nesting, slices."""
    if isinstance(cfg, list):
        return [_otype_tree(c) for c in cfg]
    if not isinstance(cfg, dict):
        return None
    tree = {"otype": str(cfg.get("otype", "")).lower()}
    if "nested" in cfg:
        tree["nested"] = _otype_tree(cfg["nested"])
    if "n_params_to_optimize" in cfg:
        tree["n_params_to_optimize"] = cfg["n_params_to_optimize"]
    return tree


# -- tinn checkpoints -------------------------------------------------------------------
def save(parts, path):
    """Write the trainer's configs, parameters and optimizer state to ``path`` (one .npz file).

    The file is written beside ``path``, flushed to disk with its directory, then renamed
    over ``path``: a crash never leaves a half-written checkpoint. A symlink's target is written, the old
    file's permissions kept (:func:`tinn._files.write_atomically`). Errors name ``path``. What :func:`load`
    would refuse (non-finite values, counters beyond ``MAX_STEPS``) is refused here (``ValueError``), before
    anything is written: the file at ``path`` stays as it was.
    """
    path = os.fspath(path)
    model, store = parts.model, parts.master
    arrays = {"params": store.read(store.params, store.offset, model.n_params),
              "inference_params": store.read(store.inference_params, store.offset, model.n_params)}
    arrays.update({f"optimizer.{k}": np.asarray(v) for k, v in parts.optimizer.state_dict().items()})  # 0-d stays 0-d
    header = {"format": FORMAT, "version": VERSION, "n_instances": model.n_instances, "n_params": model.n_params,
              "model": model.hyperparams(), "loss": parts.loss.hyperparams(),
              "optimizer": parts.optimizer.hyperparams()}
    for name, a in arrays.items():
        _check_values(f"{path}: cannot save the checkpoint", name, a)
    if parts.loss_scaler is not None:
        header.update(precision="float16", loss_scale=parts.loss_scaler.state())
    arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), np.uint8)
    write_atomically(path, lambda f: _savez(f, arrays), "cannot save the checkpoint")


def _savez(f, arrays: dict):
    """``np.savez(f, **arrays)`` (the same archive: stored ``<name>.npy`` members, zip64 allowed), but a write cut
    short (a Ctrl-C) leaves no open zip behind: numpy's would stay open, and its finaliser, run by some later garbage
    collection, prints zipfile's "Exception ignored ... seek of closed file" (the file is discarded anyway)."""
    archive, member = zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True), None
    try:
        for name, a in arrays.items():
            member = archive.open(name + ".npy", mode="w", force_zip64=True)
            np.lib.format.write_array(member, np.asanyarray(a), allow_pickle=False)
            member.close()
        archive.close()
    except BaseException:
        if member is not None:
            io.BufferedIOBase.close(member)     # closed as a file only: zipfile's close would write to the archive
        archive.fp = None                       # closed for zipfile too: its finaliser has nothing to write
        raise


class _Archive:
    """The members of a checkpoint archive, each read only after its declared size and its .npy
    header (dtype, shape) have been checked against what the trainer expects."""

    def __init__(self, f, path: str):
        self.path = path
        try:
            self.zip = zipfile.ZipFile(f)
            infos = self.zip.infolist()
        except (OSError, zipfile.BadZipFile, ValueError, EOFError, RuntimeError) as e:
            raise ValueError(f"{path}: not a tinn checkpoint (unreadable archive: {e})") from None
        seen, duplicates = set(), set()
        for info in infos:
            (duplicates if info.filename in seen else seen).add(info.filename)
        duplicates = sorted(duplicates)
        if duplicates:
            raise ValueError(f"{path}: damaged tinn checkpoint (duplicate members {duplicates[:5]})")
        self.infos = {info.filename: info for info in infos}

    def names(self) -> set:
        return {n[:-4] for n in self.infos if n.endswith(".npy")}

    def read(self, name: str, dtype, shape, max_bytes: int | None = None) -> np.ndarray:
        """Member ``name`` as a C-contiguous array of exactly ``dtype`` and ``shape`` (``shape=None``:
        any 1-D length up to ``max_bytes``), else ``ValueError``; the data is read only after that check."""
        info = self.infos.get(name + ".npy")
        if info is None:
            raise ValueError(f"{self.path}: checkpoint array '{name}' is missing")
        dtype = np.dtype(dtype)
        limit = (max_bytes if shape is None else int(np.prod(shape)) * dtype.itemsize) + _NPY_SLACK
        if info.file_size > limit:
            raise ValueError(f"{self.path}: checkpoint array '{name}' is larger than this trainer's "
                             f"({dtype}{list(shape or [])})")
        try:
            with self.zip.open(info) as fp:
                reader = _NPY_HEADERS.get(np.lib.format.read_magic(fp))
                if reader is None:
                    raise ValueError(f"checkpoint array '{name}' has an unsupported .npy version")
                got_shape, fortran, got_dtype = reader(fp)
                if got_dtype != dtype or (shape is not None and tuple(got_shape) != tuple(shape)) or \
                        (shape is None and len(got_shape) != 1):
                    raise ValueError(f"checkpoint array '{name}' is {got_dtype}{list(got_shape)}, this trainer "
                                     f"needs {dtype}{list(shape) if shape is not None else '[n]'}")
                count = int(np.prod(got_shape))
                if count * dtype.itemsize > limit:
                    raise ValueError(f"checkpoint array '{name}' declares {count} values, more than expected")
                raw = fp.read(count * dtype.itemsize)
                if len(raw) != count * dtype.itemsize or fp.read(1):     # reading to the end checks the CRC
                    raise ValueError(f"checkpoint array '{name}' does not hold exactly its declared data")
        except ValueError as e:
            msg = str(e)
            raise ValueError(msg if msg.startswith(self.path) else f"{self.path}: {msg}") from None
        except Exception as e:               # any other failure to parse means a damaged (or hostile) file
            raise ValueError(f"{self.path}: damaged tinn checkpoint ({type(e).__name__}: {e})") from None
        array = np.frombuffer(raw, dtype).reshape(got_shape, order="F" if fortran else "C")
        return np.ascontiguousarray(array).reshape(got_shape)          # (ascontiguousarray makes a 0-d array 1-d)


def _read_header(archive: _Archive) -> dict:
    path = archive.path
    if "header" not in archive.names():
        raise ValueError(f"{path}: not a tinn checkpoint (no header)")
    raw = archive.read("header", np.uint8, None, _MAX_HEADER)
    try:
        check_json_depth(raw.tobytes(), _MAX_HEADER_DEPTH)
        header = json.loads(raw.tobytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: damaged tinn checkpoint header ({e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{path}: not a tinn checkpoint")
    if header.get("version") != VERSION:
        raise ValueError(f"{path}: unsupported tinn checkpoint version {header.get('version')!r} "
                         f"(supported: {VERSION})")
    return header


def _check_values(path: str, name: str, a: np.ndarray):
    """Parameters and state must be finite; step counters within [0, MAX_STEPS]."""
    if a.dtype.kind == "f":
        if not np.isfinite(a).all():
            raise ValueError(f"{path}: checkpoint array '{name}' holds non-finite values "
                             f"({int(np.size(a) - np.isfinite(a).sum())} of {np.size(a)})")
    elif a.dtype.kind in "iu" and a.size and (a.min() < 0 or a.max() > MAX_STEPS):
        raise ValueError(f"{path}: checkpoint array '{name}' holds counters outside [0, {MAX_STEPS}] "
                         f"(from {a.min()} to {a.max()})")


def load(parts, path):
    """Restore a checkpoint written by :func:`save` into the trainer's ``parts``.

    Everything is checked before anything changes: the file (a regular file), the archive
    (no duplicate members, every declared size bounded by what the trainer holds), the
    header and its configs (the optimizer and loss are built from them off to the side, so
    their hyperparameters are validated as a config and the state's shapes follow from
    them), and every array (dtype, shape, finite values, counters within bounds). Only
    then are hyperparameters, optimizer state and parameters replaced; a failure there
    restores the trainer's previous state.
    """
    model, optimizer = parts.model, parts.optimizer
    K, n = model.n_instances, model.n_params
    path = os.fspath(path)
    with open_regular(path, "tinn checkpoint") as f:
        archive = _Archive(f, path)
        header = _read_header(archive)

        def mismatch(what, got, want):
            raise ValueError(f"{path}: checkpoint {what} {got!r} does not match this trainer's {want!r}")

        if header.get("n_instances") != K or isinstance(header.get("n_instances"), bool):
            mismatch("n_instances", header.get("n_instances"), K)
        if header.get("n_params") != n or isinstance(header.get("n_params"), bool):
            mismatch("n_params", header.get("n_params"), n)
        if header.get("model") != _canonical(model.hyperparams()):
            mismatch("model config", header.get("model"), _canonical(model.hyperparams()))
        if header.get("precision", "float32") != model.store.precision:
            mismatch("precision", header.get("precision", "float32"), model.store.precision)
        scale_state = parts.loss_scaler and parts.loss_scaler.check_state(header.get("loss_scale"), path)
        loss_cfg, opt_cfg = header.get("loss"), header.get("optimizer")
        loss_otype = parts.loss.hyperparams()["otype"]
        if not isinstance(loss_cfg, dict) or str(loss_cfg.get("otype", "")).lower() != loss_otype.lower():
            mismatch("loss", loss_cfg, parts.loss.hyperparams())
        if _otype_tree(opt_cfg) != _otype_tree(_canonical(optimizer.hyperparams())):
            mismatch("optimizer", opt_cfg, optimizer.hyperparams())
        try:                                   # the file's hyperparameters, built off to the side
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                create_loss(loss_cfg)
                incoming = create_optimizer(opt_cfg)
                if incoming.hyperparams() == optimizer.hyperparams():
                    incoming = optimizer           # same hyperparameters: the same state shapes
                else:
                    incoming.allocate(n, model.layer_sizes(), K)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: checkpoint has an invalid config: {e}") from None

        expected = {"params": ((K, n), np.float32), "inference_params": ((K, n), np.float32)}
        expected.update({f"optimizer.{k}": (v.shape, v.dtype) for k, v in incoming.state_dict().items()})
        del incoming
        names = archive.names() - {"header"}
        missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
        if missing or extra or len(names) + 1 != len(archive.infos):
            raise ValueError(f"{path}: checkpoint arrays do not match this trainer's optimizer state: "
                             f"missing {missing}, unexpected {extra}")
        arrays = {}
        for name, (shape, dtype) in expected.items():
            arrays[name] = archive.read(name, dtype, shape)
            _check_values(path, name, arrays[name])
    state = {k[len("optimizer."):]: v for k, v in arrays.items() if k.startswith("optimizer.")}
    _commit(parts, opt_cfg, loss_cfg, state, arrays["params"], arrays["inference_params"], scale_state)


def _commit(parts, opt_cfg, loss_cfg, state, params, inference_params, scale_state):
    """Replace hyperparameters, optimizer state, parameters (and a float16 model's loss scale); on a failure
    put the old ones back."""
    model, store, optimizer, loss = parts.model, parts.master, parts.optimizer, parts.loss
    old = (optimizer.hyperparams(), loss.hyperparams(), optimizer.state_dict(),
           store.read(store.params, store.offset, model.n_params),
           store.read(store.inference_params, store.offset, model.n_params),
           parts.loss_scaler and parts.loss_scaler.state())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimizer.update_hyperparams(opt_cfg)
        loss.update_hyperparams(loss_cfg)
        optimizer.load_state_dict(state)
        _write_params(parts, params, inference_params, scale_state)
    except BaseException:
        optimizer.update_hyperparams(old[0])
        loss.update_hyperparams(old[1])
        optimizer.load_state_dict(old[2])
        _write_params(parts, old[3], old[4], old[5])
        raise


def _write_params(parts, params, inference_params, scale_state):
    """The weights into the store the optimizer steps; a float16 model's rounded from them, its scale restored."""
    store = parts.master
    store.write(store.params, store.offset, params)
    store.write(store.inference_params, store.offset, inference_params)
    if scale_state:
        parts.loss_scaler.load_state(scale_state)
    parts.publish()
