"""Checkpoints: tinn's own (everything, to resume training) and tcnn's parameter snapshot.

tinn checkpoint (``Trainer.save`` / ``Trainer.load``): one ``.npz`` archive (numpy's
zip of ``.npy`` files, no pickle) holding

* ``header`` — a uint8 array of UTF-8 JSON: ``format`` ("tinn-checkpoint"),
  ``version`` (1), ``n_instances``, ``n_params``, and the ``model``, ``loss`` and
  ``optimizer`` hyperparameters (full configs, defaults included);
* ``params`` — the training parameters, float32 ``(n_instances, n_params)``;
* ``inference_params`` — the weights ``inference()`` reads (the optimizer's EMA /
  average / lookahead weights when it keeps them, else equal to ``params``);
* ``optimizer.<key>`` — every array of ``optimizer.state_dict()`` (nested optimizers'
  keys prefixed, step counters included).

Loading reads the file with ``allow_pickle=False`` after checking the archive's
declared sizes, validates everything (format, shapes, dtypes, model config, optimizer
and loss structure) and only then writes; any problem is a ``ValueError`` that leaves
the trainer untouched. Hyperparameter values (learning rate, betas, ...) are taken
from the file, so a trainer changed with ``update_hyperparams`` resumes as saved.

tcnn snapshot (``Trainer.export_tcnn`` / ``Trainer.load_tcnn``): tcnn's
``Trainer::serialize()`` JSON, ``{"n_params", "params_type", "params_binary":
{"bytes": [...], "subtype": null}}``, with the parameters in tcnn's flat order
(network matrices, then encoding parameters). Export writes the inference weights as
"float" (as tcnn does); import also accepts "__half".
"""
from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile

import numpy as np

FORMAT, VERSION = "tinn-checkpoint", 1
_MAX_HEADER = 1 << 24
_NPY_SLACK = 4096          # bytes an .npy header may add to its data


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
def save(trainer, path):
    """Write ``trainer``'s configs, parameters and optimizer state to ``path`` (one .npz file)."""
    trainer._check_runtime()
    model, store = trainer.model, trainer.model.store
    arrays = {"params": store.read(store.params, store.offset, model.n_params),
              "inference_params": store.read(store.inference_params, store.offset, model.n_params)}
    arrays.update({f"optimizer.{k}": np.ascontiguousarray(v) for k, v in trainer.optimizer.state_dict().items()})
    header = {"format": FORMAT, "version": VERSION, "n_instances": model.n_instances, "n_params": model.n_params,
              "model": model.hyperparams(), "loss": trainer.loss.hyperparams(),
              "optimizer": trainer.optimizer.hyperparams()}
    arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), np.uint8)
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".tinn-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)             # never leaves a half-written checkpoint behind
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _members(path) -> dict:
    """Declared (uncompressed) sizes of the archive's members."""
    try:
        with zipfile.ZipFile(path) as zf:
            return {info.filename: info.file_size for info in zf.infolist()}
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as e:
        raise ValueError(f"{path}: not a tinn checkpoint (unreadable archive: {e})") from None


def _read(path, names) -> dict:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in names}
    except Exception as e:               # any failure to parse means a damaged (or hostile) file
        raise ValueError(f"{path}: damaged tinn checkpoint ({type(e).__name__}: {e})") from None


def _read_header(path, sizes: dict) -> dict:
    if sizes.get("header.npy", _MAX_HEADER + 1) > _MAX_HEADER:
        raise ValueError(f"{path}: not a tinn checkpoint (no header)")
    raw = _read(path, ["header"])["header"]
    try:
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise ValueError("header is not a uint8 array")
        header = json.loads(raw.tobytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: damaged tinn checkpoint header ({e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{path}: not a tinn checkpoint")
    if header.get("version") != VERSION:
        raise ValueError(f"{path}: unsupported tinn checkpoint version {header.get('version')!r} "
                         f"(supported: {VERSION})")
    return header


def load(trainer, path):
    """Restore a checkpoint written by :func:`save` into ``trainer`` (validated before any change)."""
    from .config import create_loss, create_optimizer

    trainer._check_runtime()
    model, store, optimizer = trainer.model, trainer.model.store, trainer.optimizer
    K, n = model.n_instances, model.n_params
    path = os.fspath(path)
    sizes = _members(path)
    header = _read_header(path, sizes)

    def mismatch(what, got, want):
        raise ValueError(f"{path}: checkpoint {what} {got!r} does not match this trainer's {want!r}")

    if header.get("n_instances") != K:
        mismatch("n_instances", header.get("n_instances"), K)
    if header.get("n_params") != n:
        mismatch("n_params", header.get("n_params"), n)
    if header.get("model") != _canonical(model.hyperparams()):
        mismatch("model config", header.get("model"), _canonical(model.hyperparams()))
    loss_cfg, opt_cfg = header.get("loss"), header.get("optimizer")
    loss_otype = trainer.loss.hyperparams()["otype"]
    if not isinstance(loss_cfg, dict) or str(loss_cfg.get("otype", "")).lower() != loss_otype.lower():
        mismatch("loss", loss_cfg, trainer.loss.hyperparams())
    if _otype_tree(opt_cfg) != _otype_tree(_canonical(optimizer.hyperparams())):
        mismatch("optimizer", opt_cfg, optimizer.hyperparams())
    try:                                                   # the file's hyperparameters must be valid
        create_loss(loss_cfg)
        create_optimizer(opt_cfg)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: checkpoint has an invalid config: {e}") from None

    expected = {"params": np.empty((K, n), np.float32), "inference_params": np.empty((K, n), np.float32)}
    expected.update({f"optimizer.{k}": v for k, v in optimizer.state_dict().items()})
    names = {m[:-4] for m in sizes if m.endswith(".npy")} - {"header"}
    missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
    if missing or extra or len(names) + 1 != len(sizes):
        raise ValueError(f"{path}: checkpoint arrays do not match this trainer's optimizer state: "
                         f"missing {missing}, unexpected {extra}")
    for name, want in expected.items():                    # refuse oversized members before reading any
        if sizes[name + ".npy"] > want.nbytes + _NPY_SLACK:
            raise ValueError(f"{path}: checkpoint array '{name}' is larger than this trainer's "
                             f"({want.dtype}{list(want.shape)})")
    arrays = _read(path, sorted(expected))
    for name, want in expected.items():
        got = arrays[name]
        if got.shape != want.shape or got.dtype != want.dtype:
            raise ValueError(f"{path}: checkpoint array '{name}' is {got.dtype}{list(got.shape)}, "
                             f"this trainer needs {want.dtype}{list(want.shape)}")

    old = (optimizer.hyperparams(), trainer.loss.hyperparams())
    try:
        optimizer.update_hyperparams(opt_cfg)
        trainer.loss.update_hyperparams(loss_cfg)
        optimizer.load_state_dict({k[len("optimizer."):]: v for k, v in arrays.items() if k.startswith("optimizer.")})
    except Exception:
        optimizer.update_hyperparams(old[0])
        trainer.loss.update_hyperparams(old[1])
        raise
    store.write(store.params, store.offset, arrays["params"])
    store.write(store.inference_params, store.offset, arrays["inference_params"])


# -- tcnn snapshots ---------------------------------------------------------------------
def export_tcnn(trainer, path, instance: int | None = None):
    """Write tcnn's ``Trainer::serialize()`` JSON (inference weights, float) for one network."""
    trainer._check_runtime()
    model, store = trainer.model, trainer.model.store
    row = _instance_row(model, instance)
    params = store.read(store.inference_params, store.offset, model.n_params)[row]
    data = {"n_params": model.n_params, "params_type": "float",
            "params_binary": {"bytes": params.astype("<f4").tobytes(), "subtype": None}}
    text = json.dumps(data, default=lambda b: list(b))
    with open(path, "w") as f:
        f.write(text)


def read_tcnn(source) -> np.ndarray:
    """The float32 parameters of a tcnn snapshot (a path, a JSON string's file, or the parsed dict)."""
    if isinstance(source, dict):
        data, where = source, "tcnn snapshot"
    else:
        where = os.fspath(source)
        try:
            with open(where, "rb") as f:
                data = json.load(io.TextIOWrapper(f, encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"{where}: not a tcnn snapshot JSON ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or "params_binary" not in data:
        raise ValueError(f"{where}: not a tcnn snapshot (no 'params_binary')")
    n = data.get("n_params")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{where}: 'n_params' must be a non-negative integer, got {n!r}")
    kinds = {"float": "<f4", "__half": "<f2"}
    ptype = data.get("params_type", "float")
    if ptype not in kinds:
        raise ValueError(f"{where}: 'params_type' must be 'float' or '__half', got {ptype!r}")
    binary = data["params_binary"]
    raw = binary.get("bytes") if isinstance(binary, dict) else None
    if not isinstance(raw, list):
        raise ValueError(f"{where}: 'params_binary' must be {{\"bytes\": [...], \"subtype\": null}}")
    try:
        b = np.array(raw, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where}: 'params_binary.bytes' must be a list of integers 0..255") from None
    if b.ndim != 1 or (b.size and (b.min() < 0 or b.max() > 255)):
        raise ValueError(f"{where}: 'params_binary.bytes' must be a list of integers 0..255")
    dtype = np.dtype(kinds[ptype])
    if b.size != n * dtype.itemsize:
        raise ValueError(f"{where}: 'params_binary' holds {b.size} bytes, {n} {ptype} params need {n * dtype.itemsize}")
    return np.frombuffer(b.astype(np.uint8).tobytes(), dtype).astype(np.float32)


def load_tcnn(trainer, source, instance: int | None = None):
    """Set the parameters (training and inference) of one network from a tcnn snapshot.

    As tcnn's ``Trainer::deserialize`` without an optimizer entry: optimizer state is kept.
    """
    trainer._check_runtime()
    model, store = trainer.model, trainer.model.store
    row = _instance_row(model, instance)
    values = read_tcnn(source)
    if values.size != model.n_params:
        raise ValueError(f"tcnn snapshot has {values.size} params, this model has {model.n_params}")
    for field in {id(store.params): store.params, id(store.inference_params): store.inference_params}.values():
        full = store.read(field, store.offset, model.n_params)
        full[row] = values
        store.write(field, store.offset, full)


def _instance_row(model, instance):
    if instance is None:
        if model.n_instances != 1:
            raise ValueError(f"this model holds {model.n_instances} networks; tcnn snapshots hold one: pass instance=")
        return 0
    if isinstance(instance, bool) or not isinstance(instance, (int, np.integer)) or \
            not 0 <= instance < model.n_instances:
        raise ValueError(f"instance must be an integer in [0, {model.n_instances}), got {instance!r}")
    return int(instance)
