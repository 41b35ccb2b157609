"""tinn.torch: tinycudann's PyTorch modules on tinn (DESIGN "PyTorch")."""
import copy
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from conftest import sample

torch = pytest.importorskip("torch", reason="tinn.torch needs torch (pip install -e '.[test]' installs it)")

import tinn  # noqa: E402
import tinn.torch as tt  # noqa: E402
from torch_checks import check_first_order  # noqa: E402
from taichi.lang import impl  # noqa: E402
from tinn.runtime.program import HALF_ARCHS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HASH = {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 10,
        "base_resolution": 4, "per_level_scale": 1.5}
NET = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 16,
       "n_hidden_layers": 2}
SMOOTH_NET = dict(NET, activation="Tanh")
ENCODINGS = {
    "Identity": {"otype": "Identity", "scale": 0.5, "offset": 0.25},
    "Frequency": {"otype": "Frequency", "n_frequencies": 3},
    "OneBlob": {"otype": "OneBlob", "n_bins": 8},
    "TriangleWave": {"otype": "TriangleWave", "n_frequencies": 3},
    "SphericalHarmonics": {"otype": "SphericalHarmonics", "degree": 3},
    "HashGrid": HASH,
    # coarse grids: a finite difference across a cell boundary (a kink of the interpolation) would not
    # be a derivative
    "DenseGrid": {"otype": "DenseGrid", "n_levels": 2, "base_resolution": 3, "per_level_scale": 2.0},
    "TiledGrid": {"otype": "TiledGrid", "n_levels": 2, "base_resolution": 3, "per_level_scale": 2.0,
                  "log2_hashmap_size": 10},
    "Permutohedral": {"otype": "Permutohedral", "n_levels": 2, "base_resolution": 3, "log2_hashmap_size": 8},
    "Composite": {"otype": "Composite", "nested": [{"otype": "Frequency", "n_dims_to_encode": 1, "n_frequencies": 2},
                                                   {"otype": "HashGrid", "n_levels": 2, "base_resolution": 3,
                                                    "log2_hashmap_size": 8}]},
}
KINKED = {"TriangleWave": 1e-4}
"""Finite-difference steps for piecewise-linear encodings with kinks close together (a step across a kink
is not a derivative)."""


@pytest.fixture
def x(rng):
    return torch.from_numpy(rng.random((37, 3), dtype=np.float32))


def test_import_tinn_does_not_import_torch():
    code = "import sys, tinn; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_without_torch_the_import_error_says_what_to_install():
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import tinn.torch\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    assert "tinn.torch needs PyTorch" in out.stdout, out.stdout + out.stderr


def test_initial_params_equal_the_native_objects():
    model = tt.NetworkWithInputEncoding(3, 2, HASH, NET, seed=7)
    native = tinn.NetworkWithInputEncoding(3, 2, HASH, NET, seed=7)
    assert isinstance(model.params, torch.nn.Parameter) and model.params.dtype == torch.float32
    np.testing.assert_array_equal(model.params.detach().numpy(), native.params())
    assert not torch.equal(model.params, tt.NetworkWithInputEncoding(3, 2, HASH, NET, seed=8).params)
    np.testing.assert_array_equal(tt.Network(16, 3, NET).params.detach().numpy(), tinn.create_network(16, 3, NET).params())
    np.testing.assert_array_equal(tt.Encoding(3, HASH, seed=3).params.detach().numpy(),
                                  tinn.create_encoding(3, HASH, seed=3).params())
    array = tt.Network(4, 2, NET, n_instances=3)
    identity = {"otype": "Identity"}                   # tinycudann's Network: inputs padded to 16 by ones
    np.testing.assert_array_equal(array.params.detach().numpy(),
                                  tinn.NetworkWithInputEncoding(4, 2, identity, NET, n_instances=3).params())
    assert array.params.shape == (3, array.n_params)
    assert [p is model.params for p in model.parameters()] == [True]


def test_attributes_hyperparams_and_repr():
    model = tt.NetworkWithInputEncoding(n_input_dims=3, n_output_dims=2, encoding_config=HASH, network_config=NET)
    assert (model.n_input_dims, model.n_output_dims, model.seed) == (3, 2, 1337)
    assert model.hyperparams() == tinn.NetworkWithInputEncoding(3, 2, HASH, NET).hyperparams()
    text = repr(model)
    assert "n_input_dims=3, n_output_dims=2, seed=1337, dtype=torch.float32, hyperparams={" in text
    enc = tt.Encoding(3, ENCODINGS["Frequency"])
    assert enc.n_output_dims == 18                     # 3 dims x 3 frequencies x (sin, cos), unpadded
    assert tt.supports_jit_fusion() is False
    tt.free_temporary_memory()


@pytest.mark.parametrize("batch", sample([1, 7, 300], keep=[1]))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_outputs_equal_native_inference_in_the_input_dtype(rng, batch, dtype):
    model = tt.NetworkWithInputEncoding(3, 2, HASH, NET)
    native = tinn.NetworkWithInputEncoding(3, 2, HASH, NET)
    x = torch.from_numpy(rng.random((batch, 3), dtype=np.float32)).to(dtype)
    expected = native.inference(x.float().numpy())
    for requires_grad in (False, True):
        y = model(x.clone().requires_grad_(requires_grad))
        assert y.dtype == dtype and y.shape == (batch, 2)
        np.testing.assert_array_equal(y.detach().float().numpy(), torch.from_numpy(expected).to(dtype).float().numpy())
    if impl.current_cfg().arch.name in HALF_ARCHS:           # float16 parameters, half outputs (tinycudann's)
        assert tt.Encoding(3, HASH, dtype=torch.float16)(x).dtype == torch.float16
    else:
        with pytest.raises(ValueError, match="float16"):
            tt.Encoding(3, HASH, dtype=torch.float16)


@pytest.mark.parametrize("family", sample(sorted(ENCODINGS), 3))
def test_model_gradients_match_finite_differences(x, family):
    torch.manual_seed(0)
    model = tt.NetworkWithInputEncoding(3, 2, ENCODINGS[family], SMOOTH_NET)
    check_first_order(model, x[:8], h=KINKED.get(family, 1e-3))


def test_encoding_and_network_gradients_match_finite_differences(x):
    check_first_order(tt.Encoding(3, HASH), x[:8])
    check_first_order(tt.Network(3, 4, SMOOTH_NET), x[:8])


def test_routed_array_gradients_match_finite_differences(x):
    model = tt.NetworkWithInputEncoding(3, 2, HASH, SMOOTH_NET, n_instances=3)
    ids = torch.tensor([0, 2, 2, 1, 0, 2, 1, 1])
    check_first_order(model, x[:8], instance=ids)


def test_array_outputs_are_each_networks_own(x):
    model = tt.Network(3, 2, NET, n_instances=3)
    ids = torch.tensor([k % 3 for k in range(len(x))])
    y = model(x, instance=ids)
    for k in range(3):
        single = tinn.NetworkWithInputEncoding(3, 2, {"otype": "Identity"}, NET)
        single.set_params(model.params[k].detach().numpy())
        np.testing.assert_allclose(y[ids == k].detach().numpy(), single.inference(x[ids == k].numpy()), atol=1e-6)


def test_several_forwards_before_one_backward(rng):
    model = tt.NetworkWithInputEncoding(3, 2, HASH, NET)
    x1 = torch.from_numpy(rng.random((50, 3), dtype=np.float32)).requires_grad_(True)
    x2 = torch.from_numpy(rng.random((20, 3), dtype=np.float32)).requires_grad_(True)
    separate = []
    for xi, scale in ((x1, 1.0), (x2, 2.0)):
        model.zero_grad()
        (model(xi) * scale).sum().backward()
        separate.append((model.params.grad.clone(), xi.grad.clone()))
        xi.grad = None
    model.zero_grad()
    y1, y2 = model(x1), model(x2)
    (y1.sum() + 2.0 * y2.sum()).backward()
    torch.testing.assert_close(model.params.grad, separate[0][0] + separate[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x1.grad, separate[0][1])
    torch.testing.assert_close(x2.grad, separate[1][1])


def test_gradients_only_where_asked(x):
    model = tt.Network(3, 2, NET)
    model(x).sum().backward()
    assert model.params.grad is not None
    model.params.requires_grad_(False)
    model.params.grad = None
    xg = x.clone().requires_grad_(True)
    model(xg).sum().backward()
    assert xg.grad is not None and model.params.grad is None
    with torch.no_grad():
        assert not model(xg).requires_grad


LARGE_HASH = dict(HASH, n_levels=16, log2_hashmap_size=15)
"""Over 2^18 parameters: copies go straight into the store's memory (``ParamStore.rows_view``)."""


@pytest.mark.parametrize("encoding", [HASH, LARGE_HASH], ids=["small", "large"])
def test_sgd_and_in_place_writes_reach_the_native_store(x, encoding):
    model = tt.NetworkWithInputEncoding(3, 2, encoding, NET)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for lr in (0.5, 0.25):
        before = model.params.detach().clone()
        opt.zero_grad()
        model(x).square().mean().backward()
        grad = model.params.grad.clone()
        opt.step()
        sched.step()
        torch.testing.assert_close(model.params.detach(), before - lr * grad)
    fresh = tinn.NetworkWithInputEncoding(3, 2, encoding, NET)
    fresh.set_params(model.params.detach().numpy())
    out, ctx = fresh.forward(x.numpy())
    fresh.backward(ctx, np.ones_like(out), input_gradient=False)
    model.zero_grad()
    model(x).sum().backward()
    np.testing.assert_array_equal(model.params.grad.numpy(), fresh.gradients())
    assert_both_paths_equal(model, x, fresh.inference(x.numpy()))
    with torch.no_grad():
        model.params.mul_(0.5)
    fresh.set_params(model.params.detach().numpy())
    assert_both_paths_equal(model, x, fresh.inference(x.numpy()))


def assert_both_paths_equal(model, x, expected):
    """The inference path (no grad) and the training path give ``expected``."""
    with torch.no_grad():
        np.testing.assert_array_equal(model(x).numpy(), expected)
    np.testing.assert_array_equal(model(x).detach().numpy(), expected)


def test_bridge_matches_native_trainer_with_adam_alike(rng, one_torch_thread):
    """tinn's Trainer (Adam, l2_reg 0, no sparse skipping; L2 loss) and torch.optim.Adam on the same
    parameters and batches stay together over several steps (torch on one thread: ``one_torch_thread``)."""
    adam = {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15, "l2_reg": 0.0,
            "skip_zero_grad_non_matrix_params": False}
    native = tinn.create_from_config(3, 2, {"loss": {"otype": "L2"}, "optimizer": adam, "encoding": HASH,
                                            "network": NET})
    model = tt.NetworkWithInputEncoding(3, 2, HASH, NET)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.99), eps=1e-15)
    for _ in range(6):
        xb, yb = rng.random((256, 3), dtype=np.float32), rng.random((256, 2), dtype=np.float32)
        native_loss = native.trainer.training_step(xb, yb)
        loss = (model(torch.from_numpy(xb)) - torch.from_numpy(yb)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert loss.item() == pytest.approx(native_loss, rel=1e-4)
    np.testing.assert_allclose(model.params.detach().numpy(), native.network.params(), rtol=1e-3, atol=2e-5)


def test_state_dict_pickle_and_deepcopy_round_trip(x):
    model = tt.NetworkWithInputEncoding(3, 2, HASH, NET)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    expected = model(x).detach()
    other = tt.NetworkWithInputEncoding(3, 2, HASH, NET, seed=99)
    other.load_state_dict(model.state_dict())
    torch.testing.assert_close(other(x), expected, rtol=0, atol=0)
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        torch.testing.assert_close(clone(x), expected, rtol=0, atol=0)
        assert clone.native_tcnn_module is not model.native_tcnn_module
        with torch.no_grad():
            clone.params.zero_()
        torch.testing.assert_close(model(x).detach(), expected, rtol=0, atol=0)      # the original is untouched
        assert clone(x).abs().max() == 0


def test_module_conversions_keep_working(x):
    model = tt.Network(3, 2, NET).to("cpu")
    expected = model(x).detach()
    model = model.double()
    assert model.params.dtype == torch.float64
    y = model(x.double())
    torch.testing.assert_close(y.float(), expected)
    y.sum().backward()
    assert model.params.grad.dtype == torch.float64


def test_bad_input_raises_before_anything_changes(x):
    model = tt.NetworkWithInputEncoding(3, 2, HASH, NET)
    array = tt.Network(3, 2, NET, n_instances=2)
    expected = model(x).detach()
    with pytest.raises(TypeError, match="torch.Tensor"):
        model(x.numpy())
    with pytest.raises(TypeError, match="floating"):
        model(x.long())
    with pytest.raises(ValueError, match="shape"):
        model(x[:, :2])
    with pytest.raises(ValueError, match="instance"):
        array(x)
    with pytest.raises(TypeError, match="integers"):
        array(x, instance=torch.zeros(len(x)))
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        array(x, instance=torch.full((len(x),), 5))
    with pytest.raises(ValueError, match="fp32 or fp16"):
        tt.Encoding(3, HASH, dtype=torch.float64)
    torch.testing.assert_close(model(x).detach(), expected, rtol=0, atol=0)


TCNN_SCRIPT = r'''
import commentjson as json
import torch
import tinycudann as tcnn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
with open("tinn/configs/config_hash.json") as f:
    config = json.load(f)
model = tcnn.NetworkWithInputEncoding(n_input_dims=2, n_output_dims=3, encoding_config=config["encoding"],
                                      network_config=config["network"]).to(device)
print(model)
encoding = tcnn.Encoding(n_input_dims=2, encoding_config=config["encoding"])
network = tcnn.Network(n_input_dims=encoding.n_output_dims, n_output_dims=3, network_config=config["network"])
sequential = torch.nn.Sequential(encoding, network).to(device)
print("jit fusion:", tcnn.supports_jit_fusion())
losses = []
for m in (model, sequential):
    optimizer = torch.optim.Adam(m.parameters(), lr=0.01)
    for i in range(30):
        batch = torch.rand([4096, 2], device=device, dtype=torch.float32)
        targets = torch.stack([batch[:, 0], batch[:, 1], batch[:, 0] * batch[:, 1]], dim=1)
        output = m(batch)
        loss = ((output - targets.to(output.dtype)) ** 2 / (output.detach() ** 2 + 0.01)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print("loss", losses[-30], "->", losses[-1])
    assert losses[-1] < 0.5 * losses[-30]
tcnn.free_temporary_memory()
print("done")
'''


@pytest.mark.full_only("a cold process importing torch; tests/clients run tinycudann-style scripts in process")
def test_a_tinycudann_script_runs_with_only_the_import_replaced(tmp_path):
    script = tmp_path / "tcnn_user.py"
    script.write_text(TCNN_SCRIPT.replace("import tinycudann as tcnn", "import tinn.torch as tcnn"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "jit fusion: False" in out.stdout and out.stdout.strip().endswith("done")
