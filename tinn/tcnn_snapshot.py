"""tcnn's parameter snapshot (``Trainer.export_tcnn`` / ``Trainer.load_tcnn``): tcnn's ``Trainer::serialize()``
JSON, ``{"n_params", "params_type", "params_binary": {"bytes": [...], "subtype": null}}``, with the parameters in
tcnn's flat order (network matrices, then encoding parameters). Export writes the inference weights as "float" (as
tcnn does); import also accepts "__half". Handed a trainer's :class:`tinn.serialization.Parts`.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ._files import check_json_depth, open_regular, write_atomically
from .params import FLOAT16_MAX


def export_tcnn(parts, path, instance: int | None = None):
    """Write tcnn's ``Trainer::serialize()`` JSON (inference weights, float) for one network, as :func:`save`
    writes: whole or not at all (the previous file stays until the new one replaces it); errors name ``path``.
    Non-finite parameters, which :func:`load_tcnn` refuses, are refused (``ValueError``) before anything is written."""
    model, store = parts.model, parts.model.store
    row = _instance_row(model, instance)
    params = store.read(store.inference_params, store.offset, model.n_params)[row]
    bad = int(np.size(params) - np.isfinite(params).sum())
    if bad:
        raise ValueError(f"{os.fspath(path)}: cannot write the tcnn snapshot: it would hold {bad} non-finite "
                         f"parameters (load_tcnn refuses them); the file was not changed")
    half = store.precision == "float16"            # as tcnn's half-precision build: "__half"
    data = {"n_params": model.n_params, "params_type": "__half" if half else "float",
            "params_binary": {"bytes": params.astype("<f2" if half else "<f4").tobytes(), "subtype": None}}
    text = json.dumps(data, default=lambda b: list(b)).encode("utf-8")
    write_atomically(path, lambda f: f.write(text), "cannot write the tcnn snapshot")


_TCNN_TYPES = {"float": "<f4", "__half": "<f2"}
_JSON_CHARS_PER_BYTE = 16          # "255, " is 5; an indented file's line holds a byte in up to 16
_MAX_JSON_DEPTH = 32               # a snapshot is 3 deep; deeper JSON is refused before it is walked


def read_tcnn(source, n_params: int | None = None) -> np.ndarray:
    """The float32 parameters of a tcnn snapshot (a path, or the parsed dict), checked strictly: ``n_params``
    a non-negative integer (and equal to ``n_params`` when given), ``params_type`` "float" or "__half",
    ``params_binary.bytes`` a list of integers 0..255 (no floats, strings or booleans) of exactly the
    parameters' size, every value finite. A path is read only if it is a regular file no larger than such a
    snapshot can be (``n_params`` given: of that many float parameters; else 2^31 - 1 bytes). Any problem is a
    ``ValueError`` naming the source."""
    if isinstance(source, dict):
        data, where = source, "tcnn snapshot"
    else:
        where = os.fspath(source)
        data = _read_json(where, (2 ** 31 - 1) if n_params is None else
                          4 * n_params * _JSON_CHARS_PER_BYTE + (1 << 16))
    if not isinstance(data, dict) or "params_binary" not in data:
        raise ValueError(f"{where}: not a tcnn snapshot (no 'params_binary')")
    n = data.get("n_params")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{where}: 'n_params' must be a non-negative integer, got {n!r}")
    if n_params is not None and n != n_params:
        raise ValueError(f"{where}: tcnn snapshot has {n} params, this model has {n_params}")
    ptype = data.get("params_type", "float")
    if not isinstance(ptype, str) or ptype not in _TCNN_TYPES:
        raise ValueError(f"{where}: 'params_type' must be 'float' or '__half', got {ptype!r}")
    binary = data["params_binary"]
    raw = binary.get("bytes") if isinstance(binary, dict) else None
    if not isinstance(raw, list):
        raise ValueError(f"{where}: 'params_binary' must be {{\"bytes\": [...], \"subtype\": null}}")
    dtype = np.dtype(_TCNN_TYPES[ptype])
    if len(raw) != n * dtype.itemsize:
        raise ValueError(f"{where}: 'params_binary' holds {len(raw)} bytes, {n} {ptype} params need "
                         f"{n * dtype.itemsize}")
    kinds = set(map(type, raw))                   # bool is not int's type: floats, strings, booleans are refused
    if kinds - {int}:
        bad = (kinds - {int}).pop().__name__
        raise ValueError(f"{where}: 'params_binary.bytes' must be a list of integers 0..255, it holds a {bad}")
    try:
        b = np.array(raw, dtype=np.int64)
    except OverflowError:
        b = None
    if b is None or (b.size and (b.min() < 0 or b.max() > 255)):
        raise ValueError(f"{where}: 'params_binary.bytes' must be a list of integers 0..255")
    values = np.frombuffer(b.astype(np.uint8).tobytes(), dtype).astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(f"{where}: tcnn snapshot holds {bad.size} non-finite parameters (NaN or infinite), "
                         f"the first at index {bad[0]}")
    return values


def _read_json(path: str, max_bytes: int):
    """The JSON value in the regular file ``path`` of at most ``max_bytes`` bytes, nested at most
    ``_MAX_JSON_DEPTH`` deep; else ``ValueError``."""
    try:
        with open_regular(path, "tcnn snapshot", max_bytes) as f:
            text = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise                                   # as Trainer.load: the OSError naming the path
    except OSError as e:
        raise ValueError(f"{path}: cannot read the tcnn snapshot ({type(e).__name__}: {e})") from None
    if len(text) > max_bytes:
        raise ValueError(f"{path}: not a tcnn snapshot (more than {max_bytes:,} bytes)")
    try:
        check_json_depth(text, _MAX_JSON_DEPTH)
        return json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a tcnn snapshot JSON ({type(e).__name__}: {e})") from None




def load_tcnn(parts, source, instance: int | None = None):
    """Set the parameters (training and inference) of one network from a tcnn snapshot.

    As tcnn's ``Trainer::deserialize`` without an optimizer entry: optimizer state is kept. A float16 model
    takes them as its float32 master weights, rounded into its own (values beyond float16's range are refused).
    The snapshot is checked whole (:func:`read_tcnn`) before anything is written, and the writes are one
    transaction: a failure or an interrupt on the way puts the previous weights back.
    """
    model = parts.model
    row = _instance_row(model, instance)
    values = read_tcnn(source, model.n_params)
    if model.store.precision == "float16" and values.size and np.abs(values).max() > FLOAT16_MAX:
        raise ValueError(f"tcnn snapshot has a parameter beyond float16's range (+-{FLOAT16_MAX:g})")
    store = parts.master
    fields = list({id(store.params): store.params, id(store.inference_params): store.inference_params}.values())
    old = [store.read(field, store.offset, model.n_params) for field in fields]
    try:
        for field, full in zip(fields, old):
            full = full.copy()
            full[row] = values
            store.write(field, store.offset, full)
        parts.publish()
    except BaseException:
        for field, full in zip(fields, old):
            store.write(field, store.offset, full)
        parts.publish()
        raise


def _instance_row(model, instance):
    if instance is None:
        if model.n_instances != 1:
            raise ValueError(f"this model holds {model.n_instances} networks; tcnn snapshots hold one: pass instance=")
        return 0
    if isinstance(instance, bool) or not isinstance(instance, (int, np.integer)) or \
            not 0 <= instance < model.n_instances:
        raise ValueError(f"instance must be an integer in [0, {model.n_instances}), got {instance!r}")
    return int(instance)
