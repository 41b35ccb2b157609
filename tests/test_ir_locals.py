"""No per-thread array of a kernel lives in memory (on CUDA: local memory): compiled on Vulkan, the final IR
of every kernel a step runs keeps no non-shared tensor alloca of 16 or more elements (``tests/irscan.py``).
Each case runs its own process on Taichi's Vulkan backend (Mesa's llvmpipe in CI) on the device path."""
import os
import shutil

import pytest

from irscan import kept_arrays, kernels_in, parse, python_name, scan

GRID_SOURCES = ("tinn/encodings/_grid_kernels.py", "tinn/encodings/_grid_block.py")

GRID_SCRIPT = """
import numpy as np
config = {"encoding": {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 15,
                       "base_resolution": 16, "per_level_scale": 1.5},
          "network": {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2},
          "loss": {"otype": "RelativeL2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2}}
rng = np.random.default_rng(0)
for D in (3,):                  # 2^3 corners: the largest per-corner vectors of the two
    model = tinn.create_from_config(D, 3, config)
    x, y = rng.random((1024, D), dtype=np.float32), rng.random((1024, 3), dtype=np.float32)
    model.trainer.training_step(x, y)
    model.network.inference(x)
    enc = tinn.create_encoding(D, config["encoding"])           # second order and input gradients
    out, ctx = enc.forward(x)
    dy = rng.normal(size=out.shape).astype(np.float32)
    enc.backward(ctx, dy, input_gradient=True)
    enc.backward_backward_input(ctx, rng.normal(size=x.shape).astype(np.float32), dy)
    routed = tinn.create_encoding(D, config["encoding"], n_instances=2)
    out, ctx = routed.forward(x, (np.arange(1024) % 2).astype(np.int32))
    routed.backward(ctx, dy, input_gradient=False)
ti.sync()
"""

needs_vulkan = pytest.mark.skipif(not (shutil.which("vulkaninfo") or os.path.isdir("/usr/share/vulkan/icd.d")),
                                  reason="no Vulkan driver")


def test_the_parser_reads_the_last_dump_of_each_kernel():
    log = ["[I 11/27/26 08:23:27.281 1] [ir_printer.cpp:operator()@993] [step_c1_0.simplify] die:",
           "    <*[Tensor (64) f32]> $3 = alloca",
           "    <*[Tensor (4, 8) f32]> $4 = alloca",
           "[I 11/27/26 08:23:27.291 1] [ir_printer.cpp:operator()@993] [step_c1_0] Scalarized:",
           "    <*[Tensor (8, 4) f32]> $5 = alloca",
           "    <*[Tensor (15) f32]> $6 = alloca",
           "    <*f32> $7 = alloca",
           "[I 11/27/26 08:23:27.301 1] [ir_printer.cpp:operator()@993] [other_c2_0] Scalarized:",
           "    <*[Tensor (2) i32]> $1 = alloca"]
    assert parse(log) == {"step_c1_0": [32], "other_c2_0": []}
    assert parse(log, min_elements=2) == {"step_c1_0": [32, 15], "other_c2_0": [2]}


PROBE_SCRIPT = """
@ti.kernel
def runtime_read(a: ti.types.ndarray(dtype=ti.f32, ndim=1), n: ti.i32):
    for i in range(a.shape[0]):
        v = ti.Vector.zero(ti.f32, 32)
        for j in ti.static(range(32)):          # written with static indices ...
            v[j] = a[i] * j
        s = 0.0
        for j in range(n):                      # ... read back in a runtime loop: kept in memory
            s += v[j]
        a[i] = s

@ti.kernel
def static_read(a: ti.types.ndarray(dtype=ti.f32, ndim=1)):
    for i in range(a.shape[0]):
        v = ti.Vector.zero(ti.f32, 32)
        for j in ti.static(range(32)):
            v[j] = a[i] * j
        s = 0.0
        for j in ti.static(range(32)):
            s += v[j]
        a[i] = s

a = ti.ndarray(ti.f32, 64)
runtime_read(a, 5)
static_read(a)
"""


SCAN = pytest.mark.arch_independent("the scan starts its own Vulkan process whatever TINN_ARCH is")
WHOLE_SCAN = pytest.mark.full_only("compiles every kernel of a step through Vulkan with the cache off (minutes); "
                                   "the probe above checks the scanner in the default suite")


@needs_vulkan
@SCAN
def test_a_per_thread_array_read_at_run_time_is_found():
    found = {python_name(k): sizes for k, sizes in scan(PROBE_SCRIPT).items()}
    assert found == {"runtime_read": [32], "static_read": []}


def test_the_grid_kernels_are_found():
    names = kernels_in(*GRID_SOURCES)
    assert {"forward", "scatter", "run_scatter", "per_sample_backward"} <= names


@needs_vulkan
@SCAN
@WHOLE_SCAN
def test_grid_kernels_keep_no_per_thread_array_in_memory():
    """A training step and an inference of a ``config_hash`` model (3D inputs), the grid's input gradients,
    second order and a routed backward: no grid kernel keeps an array of >= 16 elements."""
    found = scan(GRID_SCRIPT)
    grid = kernels_in(*GRID_SOURCES)
    assert any(k.startswith("run_scatter") for k in found) and any(k.startswith("forward") for k in found)
    assert kept_arrays(found, grid) == {}


MLP_SOURCES = ("tinn/networks/_fused_mlp.py",)

MLP_SCRIPT = """
import numpy as np
from tinn.batch import buffers as _buffers
config = {"encoding": {"otype": "HashGrid", "n_levels": 4, "log2_hashmap_size": 12},
          "network": {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2},
          "loss": {"otype": "RelativeL2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2}}
rng = np.random.default_rng(0)
x, y = rng.random((1024, 2), dtype=np.float32), rng.random((1024, 3), dtype=np.float32)
single = tinn.create_from_config(2, 3, config)                       # a training step and an inference
single.trainer.training_step(x, y)
single.network.inference(x)
array = tinn.create_from_config(2, 3, config, n_instances=4)          # a routed and a dense array step
array.trainer.training_step(_buffers.put(x), _buffers.put(y), _buffers.put((np.arange(1024) % 4).astype(np.int32), ti.i32))
array.trainer.training_step(_buffers.put(x.reshape(4, 256, 2)), _buffers.put(y.reshape(4, 256, 3)))
array.network.inference(_buffers.put(x.reshape(4, 256, 2)))                # the grid inside, dense outputs
freq = tinn.create_from_config(2, 3, dict(config, encoding={"otype": "Frequency", "n_frequencies": 6}), n_instances=4)
freq.network.inference(_buffers.put(x), _buffers.put((np.arange(1024) % 4).astype(np.int32), ti.i32))
colour = {"otype": "Composite", "nested": [{"otype": "SphericalHarmonics", "degree": 4, "n_dims_to_encode": 3},
                                           {"otype": "Identity"}]}                  # examples/nerf.py's colour input
nerf = tinn.create_from_config(5, 3, dict(config, encoding=colour))
nerf.network.inference(_buffers.put(rng.random((1024, 5), dtype=np.float32)))   # SH and Identity inside
tanh = tinn.create_network(2, 3, {"otype": "FullyFusedMLP", "n_neurons": 32, "n_hidden_layers": 2, "activation": "Tanh"})
out, ctx = tanh.forward(x)                                            # kept pre-activations, dL/dx
tanh.backward(ctx, rng.random((1024, 3), dtype=np.float32))
ti.sync()
"""


@needs_vulkan
@SCAN
@WHOLE_SCAN
def test_no_fused_mlp_kernel_keeps_a_per_thread_array():
    """The fused MLP's forward and backward (a single network's training step and inference, a routed and a dense
    array's step, a dense array's inference with the grid inside the forward, a routed one with Frequency inside, a
    NeRF colour network's with its Composite (SphericalHarmonics and Identity) inside, an MLP that keeps pre-activations and returns dL/dx): every register tile is indexed statically,
    so no kernel of ``_fused_mlp.py`` keeps a per-thread array of 16+ values."""
    found = scan(MLP_SCRIPT)
    names = kernels_in(*MLP_SOURCES)
    scanned = {k: v for k, v in found.items() if python_name(k) in names}
    assert {python_name(k) for k in scanned} == {"forward", "backward"}
    assert not {k: v for k, v in scanned.items() if v}
