"""Bad input gets a clear Python exception, raised before any kernel runs."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import taichi as ti

import tinn
from conftest import SMALL_GRID, SMALL_NET

ENC, NET = SMALL_GRID, SMALL_NET


@pytest.fixture
def model(small_model):
    return small_model


def test_inputs_of_the_wrong_type_shape_or_dtype(model):
    x = np.random.rand(8, 2).astype(np.float32)
    with pytest.raises(TypeError, match="numpy array"):
        model.inference(x.tolist())
    with pytest.raises(TypeError, match="float32"):
        model.inference(x.astype(np.float64))
    with pytest.raises(ValueError, match=r"\(batch, 2\)"):
        model.inference(np.random.rand(8, 3).astype(np.float32))
    with pytest.raises(ValueError, match=r"\(batch, 2\)"):
        model.inference(np.random.rand(8).astype(np.float32))
    with pytest.raises(ValueError, match="empty"):
        model.inference(np.zeros((0, 2), np.float32))
    with pytest.raises(ValueError, match="instance"):
        model.inference(x, instance=np.zeros(8, np.int32) + 1)
    with pytest.raises(TypeError, match="int32"):
        model.inference(x, instance=np.zeros(8, np.int64))


def ndarray(a):
    out = ti.ndarray(ti.f32, a.shape)
    out.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    return out


def test_ti_ndarray_batches_give_ti_ndarray_results(model):
    """Results have the caller's kind: ti.ndarray in, ti.ndarray out (numpy in, numpy out), same values."""
    rng = np.random.default_rng(3)
    x, g, v = (rng.random((5, n), dtype=np.float32) for n in (2, 3, 2))
    y_np, ctx_np = model.forward(x)
    dx_np = model.backward(ctx_np, g)
    second_np = model.backward_backward_input(ctx_np, v, g)
    loss = tinn.create_loss({"otype": "L2"})
    _, dL_np = loss.evaluate(y_np, g)

    y, ctx = model.forward(ndarray(x))
    results = [model.inference(ndarray(x)), y, model.backward(ctx, ndarray(g)),
               *model.backward_backward_input(ctx, ndarray(v), ndarray(g)), loss.evaluate(y, ndarray(g))[1]]
    expected = [model.inference(x), y_np, dx_np, *second_np, dL_np]
    for got, want in zip(results, expected):
        assert isinstance(want, np.ndarray) and isinstance(got, ti.Ndarray)
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-6, atol=1e-7)


def test_torch_tensors_that_require_grad_are_refused_not_detached(model):
    """The native API takes torch tensors as data; one that requires grad would silently lose its
    gradients, so it is refused with a pointer to tinn.torch (tinycudann's modules)."""
    torch = pytest.importorskip("torch")
    x = torch.rand(5, 2)
    np.testing.assert_array_equal(model.inference(x), model.inference(x.numpy()))
    with pytest.raises(TypeError, match="requires grad.*tinn.torch"):
        model.inference(x.requires_grad_(True))
    with pytest.raises(TypeError, match="requires grad"):
        model.forward(torch.rand(5, 2, requires_grad=True))


def test_training_inputs_are_checked(model):
    trainer = tinn.Trainer(model, tinn.create_optimizer({}), tinn.create_loss({}))
    x = np.random.rand(8, 2).astype(np.float32)
    with pytest.raises(ValueError, match="target"):
        trainer.training_step(x, np.zeros((8, 2), np.float32))
    with pytest.raises(ValueError, match="target has 7"):
        trainer.training_step(x, np.zeros((7, 3), np.float32))
    with pytest.raises(TypeError, match="target"):
        trainer.training_step(x, np.zeros((8, 3), np.float64))


def test_backward_checks_its_context_and_gradient(model):
    x = np.random.rand(4, 2).astype(np.float32)
    _, ctx = model.forward(x)
    other = tinn.NetworkWithInputEncoding(2, 3, ENC, NET)
    with pytest.raises(ValueError, match="context"):
        other.backward(ctx, np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match="samples"):
        model.backward(ctx, np.ones((5, 3), np.float32))
    with pytest.raises(ValueError, match="mode"):
        model.backward(ctx, np.ones((4, 3), np.float32), mode="sometimes")


@pytest.mark.parametrize("factory, config", [
    (lambda c: tinn.create_encoding(2, c), {"otype": "HashGridd"}),
    (lambda c: tinn.create_network(16, 1, c), {"otype": "ResNet"}),
    (tinn.create_loss, {"otype": "Huber"}),
    (tinn.create_optimizer, {"otype": "AdamW"}),
])
def test_unknown_otype_lists_valid_names(factory, config):
    with pytest.raises(ValueError, match="valid otypes: .*"):
        factory(config)


@pytest.mark.parametrize("config, key", [
    ({"otype": "HashGrid", "n_features_per_level": 3}, "n_features_per_level"),
    ({"otype": "HashGrid", "n_levels": 0}, "n_levels"),
    ({"otype": "HashGrid", "type": "Octree"}, "type"),
    ({"otype": "HashGrid", "interpolation": "Cubic"}, "interpolation"),
    ({"otype": "HashGrid", "n_levels": 4, "n_features": 8}, "n_levels"),
    ({"otype": "HashGrid", "hash": "Prime"}, "hash"),
    ({"otype": "Frequency", "n_frequencies": "many"}, "n_frequencies"),
])
def test_bad_encoding_values_name_the_key(config, key):
    with pytest.raises(ValueError, match=key):
        tinn.create_encoding(2, config)


@pytest.mark.parametrize("config, key", [
    ({"activation": "Swish"}, "activation"),
    ({"output_activation": "relu6"}, "output_activation"),
    ({"n_neurons": 0}, "n_neurons"),
    ({"n_hidden_layers": 1.5}, "n_hidden_layers"),
])
def test_bad_network_values_name_the_key(config, key):
    with pytest.raises(ValueError, match=key):
        tinn.create_network(16, 3, {"otype": "CutlassMLP", **config})


def test_grid_dimension_limit():
    with pytest.raises(ValueError, match="1 to 4 input dims"):
        tinn.create_encoding(5, {"otype": "HashGrid"})


def test_unknown_keys_warn():
    with pytest.warns(UserWarning, match="n_frequency"):
        tinn.create_encoding(1, {"otype": "Frequency", "n_frequency": 3})


def test_config_must_be_dict_or_path():
    with pytest.raises(TypeError, match="dict or a path"):
        tinn.create_from_config(2, 3, 42)


def _run(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


CPU_PROCESS = pytest.mark.arch_independent("a subprocess that starts ti.cpu whatever TINN_ARCH is")


@CPU_PROCESS
def test_import_does_not_init_and_use_before_init_is_explained():
    result = _run("""
        from taichi.lang import impl
        import tinn
        assert impl.get_runtime().prog is None, "importing tinn must not call ti.init"
        try:
            tinn.create_network(16, 3, {})
        except RuntimeError as e:
            print("ERR", e)
    """)
    assert result.returncode == 0, result.stderr
    assert "ERR" in result.stdout and "ti.init" in result.stdout


@CPU_PROCESS
def test_use_after_reinit_raises_instead_of_crashing():
    result = _run("""
        import numpy as np, taichi as ti, tinn
        ti.init(arch=ti.cpu, log_level=ti.WARN)
        model = tinn.create_from_config(2, 3, {"encoding": {"otype": "Identity"},
                                               "network": {"n_neurons": 16, "n_hidden_layers": 1}})
        x = np.random.rand(4, 2).astype(np.float32)
        model.network.inference(x)
        ti.init(arch=ti.cpu, log_level=ti.WARN)
        for call in (lambda: model.network.inference(x), lambda: model.trainer.training_step(x, x[:, :1].repeat(3, 1)),
                     lambda: model.network.params()):
            try:
                call()
            except tinn.RuntimeResetError as e:
                print("RESET", e)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("RESET") == 3


@CPU_PROCESS
@pytest.mark.parametrize("arch", ["cpu", "device path"])
def test_a_ti_ndarray_from_before_reinit_raises_instead_of_crashing(arch):
    """A batch or ids held in a ti.ndarray made before ti.init was called again (its memory freed) is
    refused with RuntimeResetError naming it, by a model built afterwards, on the CPU path and the device path."""
    result = _run(f"""
        import numpy as np, taichi as ti, tinn
        ti.init(arch=ti.cpu, log_level=ti.WARN)
        tinn.runtime.program.FORCE = {arch == "device path"}
        x = ti.ndarray(ti.f32, (8, 2))
        ids = ti.ndarray(ti.i32, (8,))
        ti.init(arch=ti.cpu, log_level=ti.WARN)
        model = tinn.create_from_config(2, 3, {{"encoding": {{"otype": "Identity"}},
                                                "network": {{"n_neurons": 16, "n_hidden_layers": 1}}}}, n_instances=2)
        fresh = ti.ndarray(ti.f32, (8, 2))
        target = ti.ndarray(ti.f32, (8, 3))
        before = model.network.params().copy()
        for call in (lambda: model.network.inference(x, np.zeros(8, np.int32)), lambda: model.network.inference(fresh, ids),
                     lambda: model.trainer.training_step(x, target, np.zeros(8, np.int32))):
            try:
                call()
            except tinn.RuntimeResetError as e:
                print("RESET", e)
        assert (model.network.params() == before).all()
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("RESET") == 3 and result.stdout.count("before ti.init was called again") == 3
    assert "ti.ndarray x" in result.stdout and "ti.ndarray instance" in result.stdout


@pytest.mark.parametrize("kind", ["numpy", "ndarray"])
def test_a_batch_checked_by_a_step_is_checked_again_afterwards(kind):
    """A trainer checks a step's batch once for all the public calls it composes; after the step the same
    arrays, changed in place, are checked again by every call."""
    trainer = tinn.create_from_config(2, 3, {"encoding": ENC, "network": NET}).trainer
    x, t = np.random.rand(64, 2).astype(np.float32), np.random.rand(64, 3).astype(np.float32)
    if kind == "ndarray":
        x, t = ndarray(x), ndarray(t)
    trainer.training_step(x, t)
    if kind == "ndarray":
        x.fill(float("nan"))
    else:
        x[5, 1] = np.nan
    with pytest.raises(ValueError, match="x must be finite"):
        trainer.model.forward(x)
    with pytest.raises(ValueError, match="x must be finite"):       # on the device path: when the loss is read
        float(trainer.training_step(x, t))
