"""Networks (spec §2) and NetworkWithInputEncoding (§2.5) against independent NumPy references.

The MLP and activation references (``tests/reference.py``) are written from
``shared/spec/TCNN_REFERENCE.md`` §2.2–2.4 and evaluated in float64; the reference backward
pass is checked against central finite differences before tinn's gradients are compared
with it. Nothing here computes an expected value with tinn code.
"""
from collections import namedtuple

import numpy as np
import pytest

import tinn
from reference import (ACTIVATIONS as ACTIVATION_NAMES, act_grad_from_output_ref, act_grad_ref, act_ref,
                       assert_close, fd_gradient, fd_input_gradient, frequency_ref, grid_geometry,
                       grid_param_grad_ref, grid_ref, identity_ref, interior_points, mlp_backward_ref,
                       mlp_forward_ref, mlp_shapes, mlp_unflatten, next_multiple, padded, random_weights)


# ---------------------------------------------------------------------------------------------
# §2.3 Activations
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ACTIVATION_NAMES)
def test_activation_reference_derivatives(name):
    """The reference derivative equals finite differences of the reference, and the spec's output-based form."""
    z = np.linspace(-2.3, 2.1, 45) + 0.0137                     # avoids z = 0 (ReLU kink)
    h = 1e-6
    fd = (act_ref(name, z + h) - act_ref(name, z - h)) / (2 * h)
    assert_close(act_grad_ref(name, z), fd, rtol=1e-7, atol=1e-8)
    from_y = act_grad_from_output_ref(name, act_ref(name, z))
    if from_y is not None:
        assert_close(act_grad_ref(name, z), from_y, rtol=1e-12, atol=1e-12)
    # Spot values of the formulas as printed in §2.3.
    if name == "Softplus":
        assert_close(act_ref(name, np.array([0.0, 0.3])), np.log(1 + np.exp(10 * np.array([0.0, 0.3]))) / 10, 1e-12)
    if name == "Squareplus":
        assert_close(act_ref(name, np.array([0.0])), [0.1], 1e-12)          # ½·√4 / 10


# ---------------------------------------------------------------------------------------------
# §2.2 MLP reference
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("act", ACTIVATION_NAMES)
@pytest.mark.parametrize("n_hidden_layers", [0, 2])
def test_mlp_reference_backward_matches_finite_differences(act, n_hidden_layers):
    """The reference's dW and dx equal central differences (float64) of the reference forward."""
    rng = np.random.default_rng(0)
    shapes = mlp_shapes(4, 5, n_hidden_layers, 3)
    params = random_weights(shapes, rng).astype(np.float64)
    x = rng.uniform(-1, 1, (6, 4))
    dL_dy = padded(rng.normal(size=(6, 3)), 16, 0.0)

    def loss_p(p):
        return (mlp_forward_ref(x, mlp_unflatten(p, shapes), act, act)[0] * dL_dy).sum()

    Ws = mlp_unflatten(params, shapes)
    _, zs, hs = mlp_forward_ref(x, Ws, act, act)
    dWs, dx = mlp_backward_ref(Ws, zs, hs, dL_dy, act, act)
    assert_close(np.concatenate([d.ravel() for d in dWs]), fd_gradient(loss_p, params, 1e-6), rtol=1e-6,
                 atol_rel=1e-7)
    assert_close(dx, fd_input_gradient(lambda z: mlp_forward_ref(z, Ws, act, act)[0], x, dL_dy, 1e-6),
                 rtol=1e-6, atol_rel=1e-7)


# ---------------------------------------------------------------------------------------------
# MLP: tinn vs the reference
# ---------------------------------------------------------------------------------------------

MlpCase = namedtuple("MlpCase", "n_in n_out n_neurons n_hidden_layers act out_act")


@pytest.fixture(scope="module")
def mlp():
    """``mlp(case)``: one tinn network per configuration, built once for this module's tests (kernels compile
    once)."""
    built = {}

    def get(case):
        if case not in built:
            # §2.1: FullyFusedMLP only takes widths 16–128 (powers of 2), NL ≥ 1 and no SiLU/Sine hidden layers;
            # CutlassMLP takes everything. Use FullyFusedMLP wherever tcnn allows it.
            fused = (case.n_neurons in (16, 32, 64, 128) and case.n_hidden_layers >= 1
                     and case.act not in ("SiLU", "Sine"))
            cfg = {"otype": "FullyFusedMLP" if fused else "CutlassMLP", "n_neurons": case.n_neurons,
                   "n_hidden_layers": case.n_hidden_layers,
                   "activation": case.act, "output_activation": case.out_act}
            built[case] = tinn.create_network(case.n_in, case.n_out, cfg)
        return built[case]

    return get


def check_mlp(mlp, case, batch, seed=0, gain=1.0):
    """Forward, inference, backward (dW and dx) of one configuration vs the float64 reference."""
    net = mlp(case)
    rng = np.random.default_rng(seed)
    shapes = mlp_shapes(case.n_in, case.n_neurons, case.n_hidden_layers, case.n_out)
    params = random_weights(shapes, rng, gain)
    net.set_params(params)
    x = rng.uniform(-1, 1, (batch, case.n_in)).astype(np.float32)
    Ws = mlp_unflatten(params, shapes)
    y_ref, zs, hs = mlp_forward_ref(x, Ws, case.act, case.out_act)

    y, ctx = net.forward(x)
    assert y.shape == (batch, case.n_out) and y.dtype == np.float32          # padded rows are trimmed
    # float32 matmuls err relative to the magnitude of the outputs (e.g. Exponential hidden layers reach ~200),
    # so the absolute floor is 1e-6 of the largest output (and at least 1e-6).
    assert_close(y, y_ref[:, :case.n_out], rtol=1e-5, atol_rel=1e-6, atol=1e-6)
    assert_close(net.inference(x), y, rtol=1e-6, atol=1e-7)

    dL_dy = rng.normal(size=(batch, case.n_out)).astype(np.float32)
    dWs, dx_ref = mlp_backward_ref(Ws, zs, hs, padded(dL_dy, y_ref.shape[1], 0.0), case.act, case.out_act)
    dx = net.backward(ctx, dL_dy)
    assert dx.shape == x.shape and dx.dtype == np.float32
    assert_close(dx, dx_ref, rtol=1e-4, atol_rel=1e-5)
    grads = net.gradients()
    assert grads.shape == (net.n_params,) and grads.dtype == np.float32
    for g, dW in zip(mlp_unflatten(grads, shapes), dWs):
        assert_close(g, dW, rtol=1e-4, atol_rel=1e-5, atol=1e-7)
    # Padded output rows receive zero loss gradient, so their weights get exactly zero gradient (§2.2).
    np.testing.assert_array_equal(mlp_unflatten(grads, shapes)[-1][case.n_out:], 0.0)
    return net


@pytest.mark.parametrize("act", ACTIVATION_NAMES)
def test_mlp_hidden_activation(mlp, act):
    check_mlp(mlp, MlpCase(16, 5, 16, 2, act, "None"), batch=257)


@pytest.mark.parametrize("act", ACTIVATION_NAMES)
def test_mlp_output_activation(mlp, act):
    """Output activation applied to the padded output and differentiated truly (Sine/SiLU too, spec §8 A7)."""
    check_mlp(mlp, MlpCase(16, 5, 16, 1, "ReLU", act), batch=257)


@pytest.mark.parametrize("n_hidden_layers", [0, 1, 3])
@pytest.mark.parametrize("batch", [1, 3, 257])
def test_mlp_depths_odd_widths_and_batches(mlp, n_hidden_layers, batch):
    """NL = 0, 1, 3 with 7 neurons and 5 outputs (padded to 16), any batch size ≥ 1."""
    check_mlp(mlp, MlpCase(32, 5, 7, n_hidden_layers, "Tanh", "Sigmoid"), batch=batch, seed=batch)


def test_mlp_batches_cut_into_blocks(mlp):
    """A batch spread over several host blocks and threads (partial last block, per-thread gradient sums)."""
    from tinn.networks._mlp_host import SAMPLES_PER_BLOCK as ROWS_PER_BLOCK
    check_mlp(mlp, MlpCase(8, 3, 16, 2, "ReLU", "None"), batch=2 * ROWS_PER_BLOCK + 5, seed=1)


@pytest.mark.parametrize("n_in, n_out, n_neurons, n_hidden_layers",
                         [(16, 5, 7, 0), (16, 5, 7, 1), (32, 5, 7, 3), (16, 17, 64, 2), (64, 3, 64, 2)])
def test_mlp_sizes(n_in, n_out, n_neurons, n_hidden_layers):
    """§2.2: n_params = H·n_in + (NL−1)·H² + P·H (NL = 0: P·n_in); layer_sizes in storage order."""
    net = tinn.create_network(n_in, n_out, {"otype": "CutlassMLP", "n_neurons": n_neurons,
                                            "n_hidden_layers": n_hidden_layers})
    P = next_multiple(n_out, 16)
    expected = P * n_in if n_hidden_layers == 0 else (n_neurons * n_in + (n_hidden_layers - 1) * n_neurons ** 2
                                                      + P * n_neurons)
    assert net.n_params == expected
    assert [tuple(s) for s in net.layer_sizes()] == mlp_shapes(n_in, n_neurons, n_hidden_layers, n_out)
    assert net.padded_output_width == P and net.n_output_dims == n_out


def test_mlp_defaults():
    """§2.1: MLP defaults n_neurons 128, n_hidden_layers 5, ReLU, output None."""
    net = tinn.create_network(16, 3, {"otype": "MLP"})
    assert net.n_params == 128 * 16 + 4 * 128 * 128 + 16 * 128
    x = np.random.default_rng(0).uniform(-1, 1, (4, 16)).astype(np.float32)
    y_ref = mlp_forward_ref(x, mlp_unflatten(net.params(), mlp_shapes(16, 128, 5, 3)), "ReLU", "None")[0]
    assert_close(net.inference(x), y_ref[:, :3], rtol=1e-5, atol=1e-6)


def test_mlp_names_are_case_insensitive():
    """§0.4: otype and activation names match case-insensitively."""
    net = tinn.create_network(16, 3, {"otype": "fullyfusedmlp", "n_neurons": 16, "n_hidden_layers": 1,
                                      "activation": "TANH", "output_activation": "sigmoid"})
    x = np.random.default_rng(1).uniform(-1, 1, (5, 16)).astype(np.float32)
    y_ref = mlp_forward_ref(x, mlp_unflatten(net.params(), mlp_shapes(16, 16, 1, 3)), "Tanh", "Sigmoid")[0]
    assert_close(net.inference(x), y_ref[:, :3], rtol=1e-5, atol=1e-6)


def test_mlp_xavier_init():
    """§2.4: each matrix U(−s, s), s = √(6 / (fan_in + fan_out)), fan_in = cols, fan_out = rows (padded P for W_NL)."""
    net = tinn.create_network(32, 5, {"n_neurons": 24, "n_hidden_layers": 2, "activation": "ReLU"})
    shapes = mlp_shapes(32, 24, 2, 5)
    for (rows, cols), W in zip(shapes, mlp_unflatten(net.params(), shapes)):
        s = np.sqrt(6 / (rows + cols))
        assert np.abs(W).max() <= s * (1 + 1e-6)
        assert W.max() > 0.9 * s and W.min() < -0.9 * s                 # the bound is really s, not smaller
        assert abs(W.std() - s / np.sqrt(3)) < 0.1 * s                 # uniform
        assert abs(W.mean()) < 0.1 * s


def test_mlp_sine_init():
    """§2.4 with activation Sine: W_0 bound 30 / fan_in, every later matrix √(6 / fan_in)."""
    net = tinn.create_network(32, 5, {"n_neurons": 24, "n_hidden_layers": 2, "activation": "Sine"})
    shapes = mlp_shapes(32, 24, 2, 5)
    for k, ((rows, cols), W) in enumerate(zip(shapes, mlp_unflatten(net.params(), shapes))):
        s = 30 / cols if k == 0 else np.sqrt(6 / cols)
        assert np.abs(W).max() <= s * (1 + 1e-6), k
        assert W.max() > 0.9 * s and W.min() < -0.9 * s, k
        assert abs(W.std() - s / np.sqrt(3)) < 0.1 * s, k


def test_mlp_gradient_modes_and_no_input_gradient(mlp):
    """mode='accumulate' adds dW, the default overwrites; input_gradient=False returns None but still sets dW."""
    case = MlpCase(16, 5, 7, 1, "Tanh", "Sigmoid")
    net = mlp(case)
    rng = np.random.default_rng(3)
    shapes = mlp_shapes(16, 7, 1, 5)
    params = random_weights(shapes, rng)
    net.set_params(params)
    Ws = mlp_unflatten(params, shapes)

    def ref_grad(x, g):
        _, zs, hs = mlp_forward_ref(x, Ws, case.act, case.out_act)
        return np.concatenate([d.ravel() for d in mlp_backward_ref(Ws, zs, hs, padded(g, 16, 0.0), case.act,
                                                                   case.out_act)[0]])

    x1, x2 = (rng.uniform(-1, 1, (b, 16)).astype(np.float32) for b in (11, 4))
    g1, g2 = (rng.normal(size=(b, 5)).astype(np.float32) for b in (11, 4))
    _, c1 = net.forward(x1)
    _, c2 = net.forward(x2)
    assert net.backward(c1, g1, input_gradient=False) is None
    assert_close(net.gradients(), ref_grad(x1, g1), rtol=1e-4, atol_rel=1e-5)
    net.backward(c2, g2, mode="accumulate")
    assert_close(net.gradients(), ref_grad(x1, g1) + ref_grad(x2, g2), rtol=1e-4, atol_rel=1e-5)
    net.backward(c2, g2)
    assert_close(net.gradients(), ref_grad(x2, g2), rtol=1e-4, atol_rel=1e-5)


# ---------------------------------------------------------------------------------------------
# §2.5 NetworkWithInputEncoding: tinn vs composing the references
# ---------------------------------------------------------------------------------------------

NWIE_CASES = {
    # name: (n_in, n_out, encoding config, network config)
    "identity": (3, 5, {"otype": "Identity", "scale": 0.5, "offset": 0.25},
                 {"otype": "CutlassMLP", "n_neurons": 7, "n_hidden_layers": 1, "activation": "Tanh",
                  "output_activation": "Sigmoid"}),
    "frequency": (2, 4, {"otype": "Frequency", "n_frequencies": 3},
                  {"otype": "CutlassMLP", "n_neurons": 7, "n_hidden_layers": 2, "activation": "Softplus",
                   "output_activation": "None"}),
    "hashgrid": (2, 3, {"otype": "HashGrid", "n_levels": 3, "n_features_per_level": 2, "log2_hashmap_size": 6,
                        "base_resolution": 4, "per_level_scale": 2.0},
                 {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU",
                  "output_activation": "None"}),
}


@pytest.fixture(scope="module")
def nwie():
    """``nwie(name)``: one NetworkWithInputEncoding per case, built once for this module's tests."""
    built = {}

    def get(name):
        if name not in built:
            n_in, n_out, enc, net = NWIE_CASES[name]
            built[name] = tinn.NetworkWithInputEncoding(n_in, n_out, enc, net)
        return built[name]

    return get


class Composition:
    """The numpy reference of one NWIE case: y = mlp(pad(encoding(x), 16)), params = [network | encoding]."""

    def __init__(self, name, rng):
        n_in, n_out, enc, net = NWIE_CASES[name]
        self.name, self.n_in, self.n_out, self.enc, self.net = name, n_in, n_out, enc, net
        self.n_enc = 0                                      # Identity and Frequency have no parameters
        if enc["otype"] == "Identity":
            self.raw, self.fill = n_in, 1.0                 # §1.0: padded with 1 after the values
        elif enc["otype"] == "Frequency":
            self.raw, self.fill = 2 * enc["n_frequencies"] * n_in, 1.0
        else:                                               # grids pad with 0
            self.levels = grid_geometry(n_in, "Hash", enc["n_levels"], enc["log2_hashmap_size"],
                                        enc["base_resolution"], enc["per_level_scale"])
            self.F = enc["n_features_per_level"]
            self.raw, self.fill = enc["n_levels"] * self.F, 0.0
            self.n_enc = self.F * sum(level.entries for level in self.levels)
        self.width = next_multiple(self.raw, 16)            # §2.5: the encoding is aligned to 16
        self.shapes = mlp_shapes(self.width, net["n_neurons"], net["n_hidden_layers"], n_out)
        self.n_net = sum(r * c for r, c in self.shapes)
        net_params = random_weights(self.shapes, rng)
        enc_params = rng.uniform(-1, 1, self.n_enc).astype(np.float32)
        self.params = np.concatenate([net_params, enc_params])   # §2.5: network first, then encoding
        self.Ws = mlp_unflatten(self.params[:self.n_net], self.shapes)
        self.theta = self.params[self.n_net:].astype(np.float64)

    def encode(self, x):
        if self.enc["otype"] == "Identity":
            e = identity_ref(x, self.enc["scale"], self.enc["offset"])
        elif self.enc["otype"] == "Frequency":
            e = frequency_ref(x, self.enc["n_frequencies"])
        else:
            e = grid_ref(x, self.theta, self.levels, self.F, "Linear", exact=True)
        return padded(e, self.width, self.fill)

    def forward(self, x):
        return mlp_forward_ref(self.encode(x), self.Ws, self.net["activation"], self.net["output_activation"])

    def gradients(self, x, dL_dy):
        """(dL/dparams [network | encoding], dL/d(encoded)) by the reference backward passes."""
        _, zs, hs = self.forward(x)
        dWs, d_enc = mlp_backward_ref(self.Ws, zs, hs, padded(dL_dy, zs[-1].shape[1], 0.0),
                                      self.net["activation"], self.net["output_activation"])
        g = [d.ravel() for d in dWs]
        if self.n_enc:
            g.append(grid_param_grad_ref(x, d_enc[:, :self.raw], self.levels, self.F, "Linear", self.n_enc))
        return np.concatenate(g), d_enc


def model_inputs(comp, rng, batch):
    if comp.enc["otype"] == "HashGrid":
        return interior_points(rng, batch, comp.n_in, comp.levels, margin=0.01)
    return rng.random((batch, comp.n_in)).astype(np.float32)


@pytest.mark.parametrize("name", list(NWIE_CASES))
def test_nwie_sizes_and_padding(nwie, name):
    """§2.5: the encoding is padded to 16 and the network takes that width; n_params = network + encoding."""
    model = nwie(name)
    comp = Composition(name, np.random.default_rng(0))
    assert model.encoding.padded_output_width == comp.width
    assert model.network.n_input_dims == comp.width
    assert model.n_params == comp.n_net + comp.n_enc
    assert model.network.n_params == comp.n_net and model.encoding.n_params == comp.n_enc
    assert model.n_input_dims == comp.n_in and model.n_output_dims == comp.n_out
    assert model.padded_output_width == 16
    assert [tuple(s) for s in model.layer_sizes()] == comp.shapes


@pytest.mark.parametrize("name", list(NWIE_CASES))
@pytest.mark.parametrize("batch", [1, 3, 257])
def test_nwie_forward(nwie, name, batch):
    """y = network(pad(encoding(x))) with params() = [network | encoding]; inference equals forward."""
    model = nwie(name)
    rng = np.random.default_rng(batch)
    comp = Composition(name, rng)
    model.set_params(comp.params)
    np.testing.assert_array_equal(model.params(), comp.params)
    x = model_inputs(comp, rng, batch)
    y, _ = model.forward(x)
    assert y.shape == (batch, comp.n_out) and y.dtype == np.float32
    assert_close(y, comp.forward(x)[0][:, :comp.n_out], rtol=1e-5, atol=2e-6)
    assert_close(model.inference(x), y, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", list(NWIE_CASES))
@pytest.mark.parametrize("batch", [1, 257])
def test_nwie_backward(nwie, name, batch):
    """Parameter gradients [network | encoding] and dL/dx vs the composed reference and finite differences."""
    model = nwie(name)
    rng = np.random.default_rng(100 + batch)
    comp = Composition(name, rng)
    model.set_params(comp.params)
    x = model_inputs(comp, rng, batch)
    dL_dy = rng.normal(size=(batch, comp.n_out)).astype(np.float32)
    _, ctx = model.forward(x)
    dx = model.backward(ctx, dL_dy)
    assert dx.shape == x.shape and dx.dtype == np.float32
    g_ref, d_enc = comp.gradients(x, dL_dy)
    g = model.gradients()
    assert g.shape == (model.n_params,)
    assert_close(g[:comp.n_net], g_ref[:comp.n_net], rtol=1e-4, atol_rel=1e-5)
    if comp.n_enc:
        assert_close(g[comp.n_net:], g_ref[comp.n_net:], rtol=1e-4, atol_rel=1e-5)
    # dL/dx: analytic chain rule for Identity (scale · dL/denc) and against finite differences for all.
    if comp.enc["otype"] == "Identity":
        assert_close(dx, comp.enc["scale"] * d_enc[:, :comp.n_in], rtol=1e-4, atol_rel=1e-5)
    # h = 1e-6 (float64): small enough that no ReLU pre-activation and no grid cell boundary is crossed.
    fd = fd_input_gradient(lambda z: comp.forward(z)[0], x, padded(dL_dy, 16, 0.0), 1e-6)
    assert_close(dx, fd, rtol=1e-3, atol_rel=1e-4)


def test_nwie_gradient_modes_and_no_input_gradient(nwie):
    """accumulate adds (network and encoding parts), the default overwrites; input_gradient=False → None."""
    model = nwie("hashgrid")
    rng = np.random.default_rng(7)
    comp = Composition("hashgrid", rng)
    model.set_params(comp.params)
    x1, x2 = model_inputs(comp, rng, 20), model_inputs(comp, rng, 6)
    g1, g2 = rng.normal(size=(20, 3)).astype(np.float32), rng.normal(size=(6, 3)).astype(np.float32)
    r1, r2 = comp.gradients(x1, g1)[0], comp.gradients(x2, g2)[0]
    _, c1 = model.forward(x1)
    _, c2 = model.forward(x2)
    assert model.backward(c1, g1, input_gradient=False) is None
    assert_close(model.gradients(), r1, rtol=1e-4, atol_rel=1e-5)
    model.backward(c2, g2, mode="accumulate")
    assert_close(model.gradients(), r1 + r2, rtol=1e-4, atol_rel=1e-5)
    model.backward(c2, g2)
    assert_close(model.gradients(), r2, rtol=1e-4, atol_rel=1e-5)


def test_nwie_identity_no_input_gradient(nwie):
    """Without parameters in the encoding and input_gradient=False, network gradients are still produced."""
    model = nwie("identity")
    rng = np.random.default_rng(8)
    comp = Composition("identity", rng)
    model.set_params(comp.params)
    x = model_inputs(comp, rng, 9)
    dL_dy = rng.normal(size=(9, comp.n_out)).astype(np.float32)
    _, ctx = model.forward(x)
    assert model.backward(ctx, dL_dy, input_gradient=False) is None
    assert_close(model.gradients(), comp.gradients(x, dL_dy)[0], rtol=1e-4, atol_rel=1e-5)


CONFIG_HASH = {
    "encoding": {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 15,
                 "base_resolution": 16, "per_level_scale": 1.5, "fixed_point_pos": False},
    "network": {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 64,
                "n_hidden_layers": 2},
}


def test_config_hash_param_count_and_init_order():
    """§1.6.9/§2.5: 2-D config_hash → 715,536 params: network 7,168 (Xavier) first, then 708,368 grid (±1e−4)."""
    model = tinn.NetworkWithInputEncoding(2, 3, CONFIG_HASH["encoding"], CONFIG_HASH["network"])
    assert model.n_params == 715536
    shapes = mlp_shapes(32, 64, 2, 3)
    assert sum(r * c for r, c in shapes) == 7168
    assert [tuple(s) for s in model.layer_sizes()] == shapes
    p = model.params()
    assert p.shape == (715536,)
    for (rows, cols), W in zip(shapes, mlp_unflatten(p[:7168], shapes)):
        s = np.sqrt(6 / (rows + cols))
        assert np.abs(W).max() <= s * (1 + 1e-6) and np.abs(W).max() > 0.9 * s
    grid = p[7168:]
    assert np.abs(grid).max() <= 1e-4 and grid.max() > 0.95e-4 and grid.min() < -0.95e-4
