"""create_from_config and the Trainer, end to end."""
import gc
import math
import os

import imageio.v3 as iio
import numpy as np
import pytest

import tinn

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
CONFIG_HASH = "config_hash"
SMALL = {"loss": {"otype": "L2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
         "encoding": {"otype": "Frequency", "n_frequencies": 2},
         "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}}


def test_create_from_config_reads_tcnns_config_by_name():
    model = tinn.create_from_config(2, 3, CONFIG_HASH)
    assert isinstance(model.network, tinn.NetworkWithInputEncoding)
    assert isinstance(model.trainer, tinn.Trainer)
    assert model.loss.name == "RelativeL2" and model.optimizer.name == "Adam"
    assert model.network.n_params == 715_536
    assert model.network.network.n_params == 7_168 and model.network.encoding.n_params == 708_368
    assert model.optimizer.hyperparams()["epsilon"] == 1e-15
    assert model.network.params().shape == (715_536,)


def test_empty_config_gives_tcnn_defaults():
    model = tinn.create_from_config(2, 1, {})
    hp = model.network.hyperparams()
    assert hp["encoding"] == {"otype": "OneBlob", "n_bins": 16}
    assert hp["network"] == {"otype": "CutlassMLP", "n_neurons": 128, "n_hidden_layers": 5,
                             "activation": "ReLU", "output_activation": "None"}
    assert model.loss.name == "RelativeL2" and model.optimizer.name == "Adam"


def test_initialisation_is_reproducible_per_seed():
    a = tinn.create_from_config(2, 3, SMALL, seed=7).network.params()
    b = tinn.create_from_config(2, 3, SMALL, seed=7).network.params()
    c = tinn.create_from_config(2, 3, SMALL, seed=8).network.params()
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_training_step_equals_its_pieces(rng):
    x = rng.random((300, 2), dtype=np.float32)
    y = rng.random((300, 3), dtype=np.float32)
    a = tinn.create_from_config(2, 3, SMALL)
    b = tinn.create_from_config(2, 3, SMALL)
    for _ in range(3):
        loss_a = a.trainer.training_step(x, y)
        ctx = b.trainer.forward(x, y)
        b.trainer.backward(ctx)
        b.trainer.optimizer_step()
        assert isinstance(loss_a, float) and loss_a == pytest.approx(ctx.loss, rel=1e-6)
    np.testing.assert_array_equal(a.network.params(), b.network.params())


def test_trainer_gradients_equal_model_backward_of_loss_gradient(rng):
    """Trainer.backward = model.backward(dL/dy of the loss), no optimizer in between."""
    x = rng.random((64, 2), dtype=np.float32)
    y = rng.random((64, 3), dtype=np.float32)
    model = tinn.create_from_config(2, 3, SMALL)
    ctx = model.trainer.forward(x, y)
    model.trainer.backward(ctx)
    from_trainer = model.network.gradients()
    out, ctx2 = model.network.forward(x)
    _, dL_dy = model.loss.evaluate(out, y)
    model.network.backward(ctx2, dL_dy)
    np.testing.assert_allclose(model.network.gradients(), from_trainer, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("config", ["SMALL", "HASH"])
def test_trainer_backward_replaces_the_previous_gradients(rng, config):
    """A second backward's gradients are those of its own batch alone (MLP and hash-grid parameters)."""
    cfg = SMALL if config == "SMALL" else dict(SMALL, encoding={"otype": "HashGrid", "n_levels": 4,
                                                                "log2_hashmap_size": 8, "base_resolution": 4})
    model = tinn.create_from_config(2, 3, cfg)
    x1, y1 = rng.random((64, 2), dtype=np.float32), rng.random((64, 3), dtype=np.float32)
    x2, y2 = rng.random((40, 2), dtype=np.float32), rng.random((40, 3), dtype=np.float32)
    model.trainer.backward(model.trainer.forward(x1, y1))
    model.trainer.backward(model.trainer.forward(x2, y2))
    from_trainer = model.network.gradients()
    out, ctx = model.network.forward(x2)
    _, dL_dy = model.loss.evaluate(out, y2)
    model.network.backward(ctx, dL_dy)
    np.testing.assert_allclose(model.network.gradients(), from_trainer, rtol=1e-6, atol=1e-9)


def test_loss_decreases_on_a_smooth_function(rng):
    model = tinn.create_from_config(2, 1, SMALL)
    x = rng.random((512, 2), dtype=np.float32)
    y = (np.sin(3 * x[:, :1]) * np.cos(2 * x[:, 1:])).astype(np.float32)
    first = model.trainer.training_step(x, y)
    for _ in range(200):
        last = model.trainer.training_step(x, y)
    assert last < 0.05 * first


def _small_image():
    img = iio.imread(os.path.join(DATA, "images", "default.jpg")).astype(np.float32) / 255
    return np.ascontiguousarray(img[::4, ::4, :3])            # 128 x 128


@pytest.mark.long_compile("config_hash at its real size: about 4 min")
@pytest.mark.full_only("150 steps of config_hash; by default test_clients trains tcnn's image sample")
def test_hash_config_learns_an_image():
    """config_hash.json on a 128x128 photo: a broken gradient could not reach the PSNR floor.

    The best constant colour scores about 12 dB on this image and an untrained model about 5 dB.
    """
    img = _small_image()
    H, W, _ = img.shape
    ys, xs = np.meshgrid((np.arange(H) + 0.5) / H, (np.arange(W) + 0.5) / W, indexing="ij")
    coords = np.stack([xs.ravel(), ys.ravel()], 1).astype(np.float32)
    colours = img.reshape(-1, 3)
    model = tinn.create_from_config(2, 3, CONFIG_HASH)
    rng = np.random.default_rng(1)
    for _ in range(150):
        idx = rng.integers(0, len(coords), 1 << 13)
        model.trainer.training_step(coords[idx], colours[idx])
    mse = np.mean((np.clip(model.network.inference(coords), 0, 1) - colours) ** 2)
    psnr = 10 * math.log10(1 / mse)
    assert psnr > 24.0, psnr


def test_torch_tensors_are_accepted(rng):
    torch = pytest.importorskip("torch")
    model = tinn.create_from_config(2, 3, SMALL)
    x = rng.random((10, 2), dtype=np.float32)
    np.testing.assert_array_equal(model.network.inference(torch.from_numpy(x)), model.network.inference(x))
    loss = model.trainer.training_step(torch.from_numpy(x), torch.zeros(10, 3))
    assert isinstance(loss, float)


def test_a_new_model_starts_with_zero_gradients(rng):
    """Stores share field memory: a model built where a dropped one trained reads zero gradients."""
    x, y = rng.random((64, 2), dtype=np.float32), rng.random((64, 3), dtype=np.float32)
    for _ in range(3):
        model = tinn.create_from_config(2, 3, SMALL)
        np.testing.assert_array_equal(model.network.gradients(), 0)
        model.trainer.training_step(x, y)
        assert np.any(model.network.gradients() != 0)
        del model
        gc.collect()                                      # free its store's columns now


def test_trainer_repr_names_model_optimizer_and_loss():
    """n_params: W_0 16 x 16 (8 frequency features padded to 16) and W_1 16 x 16 (3 outputs padded to 16)."""
    text = repr(tinn.create_from_config(2, 3, SMALL, n_instances=2).trainer)
    assert text == ("Trainer(model=NetworkWithInputEncoding(Frequency + FullyFusedMLP, 2 -> 3, n_params=512, "
                    "n_instances=2), optimizer=Adam(learning_rate=0.01), loss=L2)")
