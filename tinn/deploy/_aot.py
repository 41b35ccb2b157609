"""The AOT module of an export: one kernel ``tinn_infer`` over ndarrays, compiled for the runtime's arch.

The kernel is a model's per-sample forward (``SampleFuncs._sample_funcs``) given the parameters as its ndarray
argument ``params[k, i]`` instead of the store's field (an AOT module's only data are its arguments)::

    tinn_infer(x: f32 (n, n_inputs), [ids: i32 (n,) for an array,] params: f32 (n_instances, n_params), y: f32 (n, n_outputs))

It is compiled for a copy of the model's structure rebuilt from ``spec`` (its otype tree, widths and number of
networks), bound at column 0 as params.bin's parameters are (the copy is for compiling only: its own store's
columns are elsewhere). ``python -m tinn.deploy._aot SPEC OUT``
does it in a process of its own, for an export asked from a runtime of another arch.
"""
import json
import sys

import taichi as ti

KERNEL = "tinn_infer"


def rebuild(spec: dict):
    """The structure of the exported object: ``spec`` is ``_export.spec_of``'s."""
    from ..network_with_input_encoding import NetworkWithInputEncoding
    from ..registry import create_encoding, create_network

    hp, K = spec["hyperparams"], spec["n_instances"]
    if spec["kind"] == "NetworkWithInputEncoding":
        obj = NetworkWithInputEncoding(spec["n_inputs"], spec["n_outputs"], hp["encoding"], hp["network"], n_instances=K)
    elif spec["kind"] == "Network":
        obj = create_network(spec["n_inputs"], spec["n_outputs"], hp, n_instances=K)
    else:
        obj = create_encoding(spec["n_inputs"], hp, n_instances=K)
        obj.set_padded_output_width(spec["n_outputs"])
    if (obj.n_params, obj.n_output_dims) != (spec["n_params"], spec["n_outputs"]):
        raise RuntimeError(f"the {spec['kind']} rebuilt from its hyperparameters has {obj.n_params} parameters and "
                           f"{obj.n_output_dims} outputs, the model {spec['n_params']} and {spec['n_outputs']}")
    obj.bind(obj.store, 0)      # its store's columns start anywhere in a shared arena; params.bin's at 0
    return obj


def inference_kernel(obj, routed: bool):
    """``tinn_infer`` for ``obj`` (parameters at column 0): one sample per parallel iteration."""
    n_in, n_out = obj.n_input_dims, obj.n_output_dims
    obj._sample_funcs(None, None)           # builds the components' kernels and tables outside Taichi scope

    def forward(params):
        return obj._sample_funcs(params, None)[0]

    @ti.func
    def sample(x: ti.template(), params: ti.template(), y: ti.template(), b, k):
        xv = ti.Vector.zero(ti.f32, n_in)
        for i in ti.static(range(n_in)):
            xv[i] = x[b, i]
        yv = ti.static(forward(params))(xv, k)
        for i in ti.static(range(n_out)):
            y[b, i] = yv[i]

    if routed:
        @ti.kernel
        def tinn_infer(x: ti.types.ndarray(ti.f32, ndim=2), ids: ti.types.ndarray(ti.i32, ndim=1),
                       params: ti.types.ndarray(ti.f32, ndim=2), y: ti.types.ndarray(ti.f32, ndim=2)):
            for b in range(x.shape[0]):
                sample(x, params, y, b, ids[b])
    else:
        @ti.kernel
        def tinn_infer(x: ti.types.ndarray(ti.f32, ndim=2), params: ti.types.ndarray(ti.f32, ndim=2),
                       y: ti.types.ndarray(ti.f32, ndim=2)):
            for b in range(x.shape[0]):
                sample(x, params, y, b, 0)
    return tinn_infer


def archive(spec: dict, path: str):
    """Compile ``spec``'s inference kernel for the current runtime's arch into the AOT archive ``path`` (.tcm)."""
    kernel = inference_kernel(rebuild(spec), spec["routed"])
    module = ti.aot.Module()
    module.add_kernel(kernel, name=KERNEL)
    module.archive(path)


if __name__ == "__main__":
    spec_path, out = sys.argv[1:3]
    with open(spec_path) as f:
        spec = json.load(f)
    ti.init(arch=getattr(ti, spec["arch"]), enable_fallback=False, offline_cache=True, log_level=ti.ERROR)
    from taichi.lang import impl
    if impl.current_cfg().arch != getattr(ti, spec["arch"]):
        sys.exit(f"Taichi runs on {impl.current_cfg().arch.name}, not {spec['arch']}")
    archive(spec, out)
