"""``tinn.deploy``: models exported with ``export`` and run from C through ``tinn_model.h`` (on Vulkan: Mesa's
llvmpipe here) give ``inference``'s outputs; every error is a message, never a crash.

The C side is ``tests/deploy_runner.c``, built once with gcc and ``python -m tinn.deploy --cflags --libs`` alone.
Python's side runs on the session's arch (``TINN_ARCH``); an export compiles its module in a process of its own on
Vulkan. Skipped only where there is no gcc or no Vulkan device. By default one model (a routed array of 2, the
error cases' export) runs from C; every other model and encoding, and the example, in the full suite.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tinn
import tinn.deploy
from tinn.encodings.identity import IdentityEncoding
from conftest import sample

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = os.path.join(ROOT, "tests", "deploy_runner.c")
SMALL_GRID = {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 8,
              "base_resolution": 4, "per_level_scale": 1.5}
SMALL_MLP = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 16,
             "n_hidden_layers": 1}
N = 777                                     # rows per run: not a multiple of any block size


def flags(*which):
    done = subprocess.run([sys.executable, "-m", "tinn.deploy", *which], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    """The runner's executable; skips the module without gcc or a Vulkan device (a runtime that does not open)."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    exe = str(tmp_path_factory.mktemp("runner") / "deploy_runner")
    built = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-O1", RUNNER, "-o", exe,
                            *flags("--cflags", "--libs")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    probe = subprocess.run([exe, str(tmp_path_factory.mktemp("nothing")), "vulkan", "1", "."], capture_output=True,
                           text=True, timeout=120)
    if "cannot create a Taichi runtime" in probe.stdout:
        pytest.skip(f"no Vulkan device: {probe.stdout.strip()}")
    return exe


def run_c(exe, folder, x, ids=None, arch="vulkan", misuse=False, env=None):
    """The runner's stdout and, on success, y (n, n_outputs)."""
    data = os.path.join(folder, "io")
    os.makedirs(data, exist_ok=True)
    np.ascontiguousarray(x, "<f4").tofile(os.path.join(data, "x.bin"))
    ids_path = os.path.join(data, "ids.bin")
    if ids is not None:
        np.ascontiguousarray(ids, "<i4").tofile(ids_path)
    elif os.path.exists(ids_path):
        os.remove(ids_path)
    done = subprocess.run([exe, folder, arch, str(len(x)), data] + (["misuse"] if misuse else []),
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode in (0, 2, 3), (done.returncode, done.stdout, done.stderr[-2000:])   # no crash
    if done.returncode:
        return done.stdout, None
    meta = json.load(open(os.path.join(folder, "model.json")))
    return done.stdout, np.fromfile(os.path.join(data, "y.bin"), "<f4").reshape(len(x), meta["n_outputs"])


def randomised(model, rng, scale=0.5):
    """Parameters drawn at a scale that makes every output depend on every part of the model."""
    model.set_params(rng.normal(0.0, scale, model.params().shape).astype(np.float32))
    return model


def check_equal(model, runner, tmp_path, rng, x, ids=None):
    meta = tinn.deploy.export(model, tmp_path / "model")
    out, y = run_c(runner, str(tmp_path / "model"), x, ids)
    assert y is not None, out
    expected = model.inference(x, ids) if ids is not None else model.inference(x)
    assert np.abs(expected).max() > 0.05                    # a model that computes something
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    return meta


@pytest.mark.full_only("another model exported and run from C; the default suite runs the error cases' routed array")
def test_config_hash_from_c_equals_inference(runner, tmp_path, rng):
    cfg = tinn.load_config("config_hash")
    model = randomised(tinn.NetworkWithInputEncoding(2, 3, cfg["encoding"], cfg["network"]), rng, 0.2)
    meta = check_equal(model, runner, tmp_path, rng, rng.random((N, 2), dtype=np.float32))
    assert (meta["n_inputs"], meta["n_outputs"], meta["n_instances"], meta["n_params"]) == (2, 3, 1, model.n_params)
    assert meta["args"] == ["x", "params", "y"] and meta["kernel"] == "tinn_infer"
    weights = np.fromfile(tmp_path / "model" / "params.bin", "<f4")
    np.testing.assert_array_equal(weights, model.params())


@pytest.mark.full_only("another model exported and run from C; the default suite runs the error cases' routed array")
def test_a_routed_array_of_four_from_c_equals_inference(runner, tmp_path, rng):
    model = randomised(tinn.NetworkWithInputEncoding(3, 2, SMALL_GRID, SMALL_MLP, n_instances=4), rng)
    ids = rng.integers(0, 4, N).astype(np.int32)
    meta = check_equal(model, runner, tmp_path, rng, rng.random((N, 3), dtype=np.float32), ids)
    assert meta["args"] == ["x", "ids", "params", "y"] and meta["n_instances"] == 4
    assert os.path.getsize(tmp_path / "model" / "params.bin") == 4 * 4 * model.n_params


@pytest.mark.full_only("another model exported and run from C; the default suite runs the error cases' routed array")
def test_frequency_and_mlp_from_c_equals_inference(runner, tmp_path, rng):
    model = randomised(tinn.NetworkWithInputEncoding(
        3, 4, {"otype": "Frequency", "n_frequencies": 4},
        {"otype": "CutlassMLP", "activation": "Tanh", "output_activation": "Sigmoid", "n_neurons": 24,
         "n_hidden_layers": 2}), rng)
    check_equal(model, runner, tmp_path, rng, rng.random((N, 3), dtype=np.float32) * 2 - 0.5)


@pytest.mark.full_only("another model exported and run from C; the default suite runs the error cases' routed array")
def test_permutohedral_from_c_equals_inference(runner, tmp_path, rng):
    model = randomised(tinn.NetworkWithInputEncoding(
        3, 1, {"otype": "Permutohedral", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 10,
               "base_resolution": 4, "per_level_scale": 2.0}, SMALL_MLP), rng)
    check_equal(model, runner, tmp_path, rng, rng.random((N, 3), dtype=np.float32))


@pytest.mark.full_only("another model exported and run from C; the default suite runs the error cases' routed array")
def test_an_encoding_and_a_network_alone_from_c_equal_inference(runner, tmp_path, rng):
    grid = randomised(tinn.create_encoding(2, SMALL_GRID), rng)
    check_equal(grid, runner, tmp_path / "grid", rng, rng.random((N, 2), dtype=np.float32))
    net = randomised(tinn.create_network(5, 3, SMALL_MLP, n_instances=2), rng)
    check_equal(net, runner, tmp_path / "net", rng, rng.normal(size=(N, 5)).astype(np.float32),
                rng.integers(0, 2, N).astype(np.int32))


@pytest.fixture(scope="module")
def small_export(tmp_path_factory):
    """A routed array of 2, exported once for the error cases: (folder, model)."""
    model = tinn.NetworkWithInputEncoding(2, 3, SMALL_GRID, SMALL_MLP, n_instances=2)
    folder = tmp_path_factory.mktemp("small") / "model"
    tinn.deploy.export(model, folder)
    return folder, model


def spoiled(small_export, tmp_path, name, change):
    """A copy of the small export with file ``name``'s bytes replaced by ``change(bytes)`` (None: deleted)."""
    folder = tmp_path / "spoiled"
    shutil.copytree(small_export[0], folder)
    data = change((folder / name).read_bytes())
    if data is None:
        (folder / name).unlink()
    else:
        (folder / name).write_bytes(data)
    return str(folder)


def set_key(key, value):
    def change(data):
        meta = json.loads(data)
        meta[key] = value
        return json.dumps(meta).encode()
    return change


@pytest.mark.parametrize("name, change, message", [
    ("model.json", lambda d: None, "cannot open"),
    ("model.tcm", lambda d: None, "cannot open"),
    ("params.bin", lambda d: None, "cannot open"),
    ("model.json", lambda d: b"{\"format\": ", "not a tinn.deploy export"),
    ("model.json", lambda d: d.replace(b'"n_inputs"', b'"n_lnputs"'), "lacks the integer key: n_inputs"),
    ("model.json", set_key("n_params", -3), "bad value for the key: n_params"),
    ("params.bin", lambda d: d[:-4], "corrupt export: params.bin holds"),
    ("model.tcm", lambda d: b"not a zip archive" * 10, "model.tcm is not a Taichi AOT archive"),
    ("model.tcm", lambda d: d[:len(d) // 2], "cannot load model.tcm"),
    ("model.json", set_key("format_version", 2), "version mismatch: model.json has format_version 2, this tinn_model.h reads 1"),
    ("model.json", set_key("taichi_version", "1.6.0"), "version mismatch: exported with Taichi 1.6.0"),
])
def test_a_missing_or_corrupt_folder_is_a_message(runner, small_export, tmp_path, rng, name, change, message):
    out, y = run_c(runner, spoiled(small_export, tmp_path, name, change), rng.random((8, 2), dtype=np.float32),
                   np.zeros(8, np.int32))
    assert y is None and out.startswith("open: tinn_model: ") and message in out, out


def test_a_folder_that_does_not_exist_is_a_message(runner, tmp_path, rng):
    out, y = run_c(runner, str(tmp_path / "nowhere"), rng.random((8, 2), dtype=np.float32))
    assert y is None and "cannot open" in out and "nowhere/model.json" in out


@pytest.mark.parametrize("arch", ["cuda", "x64", "metal", "x86"])
def test_an_arch_other_than_vulkan_is_a_message(runner, small_export, rng, arch):
    out, y = run_c(runner, str(small_export[0]), rng.random((8, 2), dtype=np.float32), np.zeros(8, np.int32), arch=arch)
    assert y is None and f"unsupported arch (tinn.deploy exports run on \"vulkan\" only): {arch}" in out, out


def test_a_module_of_another_arch_is_a_message(runner, small_export, tmp_path, rng):
    folder = spoiled(small_export, tmp_path, "model.json", set_key("arch", "metal"))
    out, y = run_c(runner, folder, rng.random((8, 2), dtype=np.float32), np.zeros(8, np.int32))
    assert y is None and "arch mismatch: the module was compiled for metal, asked to run on vulkan" in out, out


def test_a_machine_without_the_arch_is_a_message(runner, small_export, rng):
    env = dict(os.environ, VK_ICD_FILENAMES=os.path.join(str(small_export[0]), "no_such_driver.json"),
               VK_DRIVER_FILES=os.path.join(str(small_export[0]), "no_such_driver.json"))
    out, y = run_c(runner, str(small_export[0]), rng.random((8, 2), dtype=np.float32), np.zeros(8, np.int32), env=env)
    assert y is None and "cannot create a Taichi runtime (no device of this arch" in out, out


def test_every_bad_call_is_a_message_and_the_model_still_runs(runner, small_export, rng):
    folder, model = small_export
    x, ids = rng.random((50, 2), dtype=np.float32), rng.integers(0, 2, 50).astype(np.int32)
    out, y = run_c(runner, str(folder), x, ids, misuse=True)
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert lines["negative n"].startswith("1 ") and "n must be at least 0" in lines["negative n"]
    assert lines["huge n"].startswith("1 ") and "n is too large" in lines["huge n"]
    assert lines["no model"].startswith("1 ") and "the model is NULL" in lines["no model"]
    assert lines["no x"].startswith("1 ") and "must not be NULL" in lines["no x"]
    assert lines["ids"].startswith("1 ") and "needs ids" in lines["ids"]
    assert lines["id out of range"].startswith("1 ") and "ids[49] = 2 is not in [0, 2)" in lines["id out of range"]
    assert lines["zero rows"].startswith("0 ")
    assert lines["no model's widths"].startswith("0 ")
    np.testing.assert_allclose(y, model.inference(x, ids), rtol=1e-5, atol=1e-5)


def test_python_side_errors_come_before_anything_is_written(tmp_path):
    model = tinn.create_network(2, 1, SMALL_MLP)
    with pytest.raises(ValueError, match="arch 'x64' is not supported"):
        tinn.deploy.export(model, tmp_path / "a", arch="x64")
    with pytest.raises(TypeError, match="takes a NetworkWithInputEncoding, Network or Encoding"):
        tinn.deploy.export(object(), tmp_path / "b")

    class Custom(IdentityEncoding):                    # a user's own encoding: its func may read anything
        otype = "MyEncoding"
    with pytest.raises(ValueError, match="otype 'MyEncoding'.*cannot be exported"):
        tinn.deploy.export(Custom(2), tmp_path / "c")
    empty = tinn.NetworkWithInputEncoding(3, 1, {"otype": "Composite", "nested": [
        {"n_dims_to_encode": 1, "otype": "Identity"}, {"n_dims_to_encode": 1, "otype": "Empty"},
        {"otype": "Identity"}]}, SMALL_MLP)
    with pytest.raises(ValueError, match="cannot be exported: an Empty encoding without padding has no outputs"):
        tinn.deploy.export(empty, tmp_path / "d")
    assert not any(os.path.exists(tmp_path / d) for d in "abcd")


def test_float16_models_export_their_inference_weights_as_float32(tmp_path, monkeypatch):
    model = tinn.NetworkWithInputEncoding(2, 1, SMALL_GRID, SMALL_MLP, precision="float16")
    monkeypatch.setattr(tinn.deploy._export, "_archive_elsewhere", lambda spec, path: open(path, "wb").close())
    meta = tinn.deploy.export(model, tmp_path)
    weights = np.fromfile(tmp_path / "params.bin", "<f4")
    expected = model.store.read(model.store.inference_params, model.store.offset, model.n_params)[0].astype(np.float32)
    assert meta["params_shape"] == [1, model.n_params]
    np.testing.assert_array_equal(weights, expected)


def test_the_header_compiles_as_c99_and_cpp17(tmp_path):
    cc = {"gcc": ("c", "-std=c99"), "g++": ("c++", "-std=c++17")}
    source = tmp_path / "use.c"
    source.write_text("#include <tinn_model.h>\n"
                      "int main(void) {\n"
                      "    tinn_model *m = tinn_model_open(\"folder\", \"vulkan\");\n"
                      "    float x[2] = {0}, y[3];\n"
                      "    int rc = m ? tinn_model_infer(m, x, NULL, 1, y) : 1;\n"
                      "    rc += tinn_model_n_inputs(m) + tinn_model_n_outputs(m) + tinn_model_n_instances(m);\n"
                      "    tinn_model_close(m);\n"
                      "    return rc + (tinn_model_last_error()[0] == 0);\n"
                      "}\n")
    for compiler, (language, std) in cc.items():
        if shutil.which(compiler) is None:
            pytest.skip(f"no {compiler}")
        built = subprocess.run([compiler, "-x", language, std, "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                                str(source), *flags("--cflags")], capture_output=True, text=True, timeout=120)
        assert built.returncode == 0, (compiler, built.stderr[-3000:])


def test_the_flags_are_the_wheels_and_nothing_else_is_printed():
    out = flags("--cflags", "--libs")
    assert all(f.startswith(("-I", "-L", "-l", "-Wl,")) for f in out), out
    assert "-ltaichi_c_api" in out
    assert any(os.path.isfile(os.path.join(f[2:], "tinn_model.h")) for f in out if f.startswith("-I"))
    assert any(os.path.isfile(os.path.join(f[2:], "taichi", "taichi_core.h")) for f in out if f.startswith("-I"))


def test_importing_tinn_imports_nothing_of_the_deploy_path():
    code = "import sys, tinn; print(sorted(m for m in sys.modules if m.startswith('tinn.deploy')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


@pytest.mark.parametrize("encoding, n_in", sample([
    ({"otype": "Identity", "scale": 2.0, "offset": -0.5}, 3),
    ({"otype": "OneBlob", "n_bins": 8}, 2),
    ({"otype": "TriangleWave", "n_frequencies": 3}, 2),
    ({"otype": "SphericalHarmonics", "degree": 3}, 3),
    ({"otype": "DenseGrid", "n_levels": 3, "base_resolution": 4, "per_level_scale": 1.5}, 2),
    ({"otype": "TiledGrid", "n_levels": 3, "base_resolution": 4, "per_level_scale": 1.5, "interpolation": "Smoothstep"}, 3),
    ({"otype": "HashGrid", "n_levels": 3, "log2_hashmap_size": 6, "base_resolution": 4, "interpolation": "Nearest"}, 2),
    ({"otype": "Composite", "reduction": "Concatenation",
      "nested": [{"n_dims_to_encode": 1, "otype": "Frequency", "n_frequencies": 2},
                 {"otype": "HashGrid", "n_levels": 2, "log2_hashmap_size": 6}]}, 3),
    ({"otype": "Composite", "reduction": "Product", "nested": [{"n_dims_to_encode": 1, "otype": "OneBlob", "n_bins": 4},
                                                               {"otype": "TriangleWave", "n_frequencies": 4}]}, 2),
    ({"otype": "NRC"}, 8),
], keep=[1, 7]))       # a per-dim encoding, and a composite with a grid
def test_the_exported_kernel_equals_inference_for_every_encoding(encoding, n_in, rng):
    """The module's kernel itself, run in this process on the session's arch (no C): parameters as an ndarray."""
    import taichi as ti
    from tinn.deploy import _aot, _export
    for K in (1, 3):
        model = randomised(tinn.NetworkWithInputEncoding(n_in, 2, encoding, SMALL_MLP, n_instances=K), rng)
        kernel = _aot.inference_kernel(_aot.rebuild(_export.spec_of(model, "vulkan")), routed=K > 1)
        x, ids = rng.random((300, n_in), dtype=np.float32), rng.integers(0, K, 300).astype(np.int32)
        arrays = [ti.ndarray(ti.f32, (300, n_in)), ti.ndarray(ti.i32, (300,)),
                  ti.ndarray(ti.f32, (K, model.n_params)), ti.ndarray(ti.f32, (300, 2))]
        for a, v in zip(arrays, (x, ids, model.params().reshape(K, -1))):
            a.from_numpy(v)
        kernel(*(arrays if K > 1 else arrays[:1] + arrays[2:]))
        expected = model.inference(x, ids) if K > 1 else model.inference(x)
        np.testing.assert_allclose(arrays[3].to_numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("program", sample(["examples/deploy/render.c", "benchmarks/deploy_infer.c"], 1))
def test_the_example_and_benchmark_programs_build_with_the_flags_alone(program, tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    built = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", os.path.join(ROOT, program),
                            "-o", str(tmp_path / "program"), *flags("--cflags", "--libs")],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]


@pytest.mark.full_only("the example's training and export; the default suite exports and runs a model from C")
def test_the_example_trains_and_exports(runner, tmp_path):
    """examples/deploy/train_and_export.py, a few steps on the CPU (its export compiles for Vulkan)."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "deploy", "train_and_export.py"),
                           "--steps", "3", "--batch", "1024", "--arch", "cpu", "--out", str(tmp_path / "model")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.load(open(tmp_path / "model" / "model.json"))
    assert (meta["n_inputs"], meta["n_outputs"], meta["hyperparams"]["encoding"]["otype"]) == (2, 3, "Grid")
    assert (tmp_path / "model" / "python.png").exists() and "exported" in done.stdout
