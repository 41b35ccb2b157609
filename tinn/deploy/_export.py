"""``export(model, folder)``: what a C or C++ program needs to run a model's inference (``tinn_model.h``).

The folder holds ``model.tcm`` (the Taichi AOT module: ``_aot.KERNEL`` over ndarrays), ``params.bin`` (the
inference weights, float32 little-endian, ``(n_instances, n_params)`` row-major; one 0 per network for a model
without parameters) and ``model.json`` (widths, number of networks, parameter count, the kernel's name and
argument order, the tinn and Taichi versions the module was made with).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import taichi as ti

from ..encodings.composite import CompositeEncoding
from ..encodings.encoding import Encoding
from ..network_with_input_encoding import NetworkWithInputEncoding
from ..networks.network import Network
from ._aot import KERNEL

ARCHS = ("vulkan",)
"""The archs an export compiles for: those whose AOT modules ``tinn_model.h`` runs and the tests check. The C API
in taichi 1.7.4's wheel creates no x64 or CUDA runtime as installed (it asks for Taichi's runtime bitcode folder,
``TI_LIB_DIR``), so those archs are not offered; Metal and OpenGL are untested."""
FORMAT_VERSION = 1
"""model.json's ``format_version``; ``tinn_model.h`` reads this one only (``TINN_MODEL_FORMAT_VERSION``)."""


def _parts(obj):
    """``obj`` and every component inside it."""
    yield obj
    if isinstance(obj, NetworkWithInputEncoding):
        yield from _parts(obj.encoding)
        yield from _parts(obj.network)
    elif isinstance(obj, CompositeEncoding):
        for e in obj.nested:
            yield from _parts(e)


def _check_exportable(obj):
    """``ValueError`` naming the first otype outside tinn's own components (its per-sample func may read data
    other than the parameters, a field, which an AOT module cannot carry), or a part without a per-sample func."""
    for part in _parts(obj):
        if not type(part).__module__.startswith("tinn."):
            otype = getattr(part, "otype", None) or part.hyperparams().get("otype", type(part).__name__)
            raise ValueError(f"tinn.deploy.export: otype {otype!r} ({type(part).__qualname__}) cannot be exported: "
                             "only tinn's own encodings and networks have per-sample funcs known to read nothing "
                             "but their parameters")
    try:
        obj._sample_funcs(None, None)                   # the funcs the kernel is made of (builds, runs nothing)
    except ValueError as e:
        raise ValueError(f"tinn.deploy.export: this {type(obj).__name__} cannot be exported: {e}") from None


def spec_of(obj, arch: str) -> dict:
    """What ``_aot.rebuild`` needs to rebuild ``obj``'s structure, and what model.json says of it."""
    kind = next(name for cls, name in ((NetworkWithInputEncoding, "NetworkWithInputEncoding"), (Network, "Network"),
                                       (Encoding, "Encoding")) if isinstance(obj, cls))
    K = obj.n_instances
    return {"kind": kind, "hyperparams": obj.hyperparams(), "n_inputs": obj.n_input_dims,
            "n_outputs": obj.n_output_dims, "n_instances": K, "n_params": obj.n_params, "routed": K > 1,
            "arch": arch}


def _inference_weights(obj) -> np.ndarray:
    """``(n_instances, max(n_params, 1))`` float32: the weights ``inference`` reads (float16 ones widened)."""
    if not obj.n_params:
        return np.zeros((obj.n_instances, 1), np.float32)
    obj._settle()
    store = obj.store
    return np.ascontiguousarray(store.read(store.inference_params, obj._offset, obj.n_params), dtype="<f4")


def _archive_elsewhere(spec: dict, path: str):
    """Compile in a child process initialised on ``spec["arch"]``: Taichi compiles AOT modules for the arch it runs
    on only, and ``ti.aot.Module`` finalises the process's root field tree (once per process: a second module, or a
    field created later, would fail in the caller's process)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
        done = subprocess.run([sys.executable, "-m", "tinn.deploy._aot", spec_path, path], env=env,
                              capture_output=True, text=True)
    if done.returncode != 0 or not os.path.isfile(path):
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise RuntimeError(f"tinn.deploy.export: compiling for {spec['arch']} in a process of its own failed "
                           f"(exit status {done.returncode}); is a {spec['arch']} device available?\n{tail}")


def export(model, folder, arch: str = "vulkan") -> dict:
    """Write ``model``'s inference to ``folder`` (created if missing) for ``tinn_model.h``: model.tcm,
    params.bin, model.json (see the module doc); returns model.json's content.

    ``model``: a ``NetworkWithInputEncoding``, ``Network`` or ``Encoding`` (or what ``create_from_config``
    returns: its ``network``), single or a network array (the C side then takes one id per row), at either
    precision (float16 models export their inference weights as float32). ``arch``: one of :data:`ARCHS`. The
    module is compiled in a child process initialised on ``arch`` (a few seconds), whatever this one runs.
    ``TypeError``/``ValueError`` for another object, arch or an otype that cannot be exported; ``RuntimeError``
    if the compile fails (no device of that arch). The folder's files are written only once all succeeded.
    """
    if not isinstance(model, (NetworkWithInputEncoding, Network, Encoding)) and hasattr(model, "trainer"):
        model = model.network                                    # a TrainableModel
    if not isinstance(model, (NetworkWithInputEncoding, Network, Encoding)):
        raise TypeError(f"tinn.deploy.export takes a NetworkWithInputEncoding, Network or Encoding, "
                        f"got {type(model).__name__}")
    if arch not in ARCHS:
        raise ValueError(f"tinn.deploy.export: arch {arch!r} is not supported; expected one of {ARCHS} (the Taichi C "
                         "API in the taichi wheel runs no x64 or CUDA module as installed; see docs/deploy.md)")
    model._check_runtime()
    _check_exportable(model)
    spec = spec_of(model, arch)
    weights = _inference_weights(model)
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        tcm = os.path.join(tmp, "model.tcm")
        _archive_elsewhere(spec, tcm)
        meta = {"format": "tinn-deploy", "format_version": FORMAT_VERSION, "arch": arch, "otype": spec["kind"],
                "n_inputs": spec["n_inputs"], "n_outputs": spec["n_outputs"], "n_instances": spec["n_instances"],
                "n_params": spec["n_params"], "routed": int(spec["routed"]), "kernel": KERNEL,
                "args": ["x", "ids", "params", "y"] if spec["routed"] else ["x", "params", "y"],
                "params_shape": list(weights.shape), "tinn_version": _tinn_version(),
                "taichi_version": ".".join(map(str, ti.__version__)),
                "hyperparams": spec["hyperparams"]}          # last: tinn_model.h reads the first keys of each name
        weights.tofile(os.path.join(tmp, "params.bin"))
        with open(os.path.join(tmp, "model.json"), "w") as f:
            json.dump(meta, f, indent=2)
        for name in ("model.tcm", "params.bin", "model.json"):
            os.replace(os.path.join(tmp, name), os.path.join(folder, name))
    return meta


def _tinn_version() -> str:
    from .. import __version__
    return __version__
