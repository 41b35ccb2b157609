"""Optimizers: several steps on fixed gradients against NumPy versions of spec §4's update equations."""
import numpy as np
import pytest

import tinn


def adam_reference(w, grads, n_matrix, lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, l2_reg=1e-8,
                   non_matrix_l2_reg=0.0, non_matrix_learning_rate_factor=1.0, relative_decay=0.0,
                   absolute_decay=0.0, clipping_magnitude=0.0, gradient_clipping_magnitude=0.0,
                   skip_zero_grad_non_matrix_params=True):
    """tcnn's Adam (spec §4.2) in float64, one gradient array per step."""
    w = w.astype(np.float64).copy()
    m, v, t = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    matrix = np.arange(w.size) < n_matrix
    for g in grads:
        g = g.astype(np.float64).copy()
        run = matrix | ~(skip_zero_grad_non_matrix_params & (g == 0))
        g += np.where(matrix, l2_reg, non_matrix_l2_reg) * w
        if gradient_clipping_magnitude:
            g = np.clip(g, -gradient_clipping_magnitude, gradient_clipping_magnitude)
        m = np.where(run, beta1 * m + (1 - beta1) * g, m)
        v = np.where(run, beta2 * v + (1 - beta2) * g * g, v)
        t = t + run
        a = lr * np.where(matrix, 1.0, non_matrix_learning_rate_factor)
        tt = np.maximum(t, 1)
        a_t = a * np.sqrt(1 - beta2 ** tt) / (1 - beta1 ** tt)
        new = (1 - relative_decay * a_t) * w - np.copysign(absolute_decay * a_t, w) - a_t / (np.sqrt(v) + epsilon) * m
        if clipping_magnitude:
            new = np.clip(new, -clipping_magnitude, clipping_magnitude)
        w = np.where(run, new, w)
    return w


ADAM_CASES = [
    {},
    {"learning_rate": 1e-2, "beta2": 0.99, "epsilon": 1e-15, "l2_reg": 1e-3},
    {"non_matrix_learning_rate_factor": 0.5, "non_matrix_l2_reg": 0.1},
    {"relative_decay": 0.1, "absolute_decay": 0.01, "learning_rate": 0.05},
    {"clipping_magnitude": 0.3, "gradient_clipping_magnitude": 0.2, "learning_rate": 0.1},
    {"skip_zero_grad_non_matrix_params": False},
]


@pytest.mark.parametrize("keys", ADAM_CASES)
def test_adam_matches_update_equations(keys, rng):
    n, n_matrix, steps = 40, 24, 6
    w0 = rng.normal(size=n).astype(np.float32)
    grads = [rng.normal(size=n).astype(np.float32) for _ in range(steps)]
    for g in grads[::2]:
        g[30:36] = 0.0                       # untouched non-matrix params (sparse Adam)
    opt = tinn.create_optimizer({"otype": "Adam", **keys})
    opt.allocate(n, [(4, 6)])
    w = w0.copy()
    for g in grads:
        opt.step(w, g)
    kw = {("lr" if k == "learning_rate" else k): v for k, v in keys.items()}
    np.testing.assert_allclose(w, adam_reference(w0, grads, n_matrix, **kw), rtol=2e-5, atol=2e-6)


def test_adam_skips_zero_gradient_non_matrix_params_entirely(rng):
    """A grid entry with zero gradient keeps its value, moments and step count (spec §4.2)."""
    w0 = rng.normal(size=8).astype(np.float32)
    opt = tinn.create_optimizer({"otype": "Adam", "learning_rate": 0.1})
    opt.allocate(8, [(2, 2)])
    w = w0.copy()
    g = np.ones(8, np.float32)
    g[6:] = 0
    opt.step(w, g)
    assert np.array_equal(w[6:], w0[6:])
    assert not np.array_equal(w[4:6], w0[4:6])
    steps = opt.param_step_counts()
    assert list(steps) == [1, 1, 1, 1, 1, 1, 0, 0]


def test_adabound_clamps_step_size(rng):
    """With adabound the effective step lies in [0.1 - 0.1/((1-b2) t + 1), 0.1 + 0.1/((1-b2) t)]."""
    w = np.zeros(4, np.float32)
    opt = tinn.create_optimizer({"otype": "Adam", "adabound": True, "learning_rate": 1.0, "l2_reg": 0.0})
    opt.allocate(4, [(2, 2)])
    g = np.full(4, 1e-3, np.float32)
    opt.step(w, g)
    m = 0.1 * 1e-3
    one_minus_beta2 = 1 - float(np.float32(0.999))        # beta2 is a float32 kernel argument
    hi = 0.1 + 0.1 / (one_minus_beta2 * 1)
    np.testing.assert_allclose(w, -hi * m, rtol=1e-5)


def test_sgd_matches_update_equation(rng):
    w0 = rng.normal(size=10).astype(np.float32)
    grads = [rng.normal(size=10).astype(np.float32) for _ in range(3)]
    opt = tinn.create_optimizer({"otype": "SGD", "learning_rate": 0.05, "l2_reg": 0.01})
    w = w0.copy()
    ref = w0.astype(np.float64)
    for g in grads:
        opt.step(w, g)
        ref = ref - 0.05 * (g + 0.01 * ref)
    np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-7)


def test_loss_scale_divides_gradients(rng):
    w0 = rng.normal(size=6).astype(np.float32)
    g = rng.normal(size=6).astype(np.float32)
    a, b = w0.copy(), w0.copy()
    tinn.create_optimizer({"otype": "SGD", "learning_rate": 0.1}).step(a, g)
    tinn.create_optimizer({"otype": "SGD", "learning_rate": 0.1}).step(b, 128 * g, loss_scale=128.0)
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_hyperparams_include_defaults_and_update():
    opt = tinn.create_optimizer({"otype": "adam", "learning_rate": 0.01})
    hp = opt.hyperparams()
    assert hp["otype"] == "Adam" and hp["learning_rate"] == 0.01 and hp["beta2"] == 0.999
    assert hp["skip_zero_grad_non_matrix_params"] is True
    assert tinn.create_optimizer(hp).hyperparams() == hp
    opt.update_hyperparams({"learning_rate": 0.5})
    assert opt.learning_rate == 0.5
    assert tinn.create_optimizer({}).hyperparams()["otype"] == "Adam"


def test_bad_optimizer_values_name_the_key():
    with pytest.raises(ValueError, match="beta1"):
        tinn.create_optimizer({"otype": "Adam", "beta1": 1.5})
    with pytest.raises(ValueError, match="learning_rate"):
        tinn.create_optimizer({"otype": "SGD", "learning_rate": "fast"})


def test_adam_bias_correction_past_the_table(monkeypatch):
    """Step counts beyond the host's bias-correction table (betas close to 1) are computed in the
    kernel: with a constant gradient every Adam step is the learning rate (m/sqrt(v) times the
    correction is 1, up to float32's rounding of 1 - beta2)."""
    import tinn.optimizers.adam as adam
    monkeypatch.setattr(adam, "BIAS_TABLE", 8)
    opt = tinn.create_optimizer({"otype": "Adam", "beta1": 0.9, "beta2": 0.99999, "learning_rate": 0.125,
                                 "l2_reg": 0.0, "epsilon": 0.0})
    params, grads = np.zeros((1, 4), np.float32), np.ones((1, 4), np.float32)
    for step in range(1, 21):
        before = params.copy()
        opt.step(params, grads)
        np.testing.assert_allclose(before - params, 0.125, rtol=1e-3, err_msg=f"step {step}")
    assert len(opt._bias_correction()) == 8


def test_shampoo_roots_of_non_finite_statistics_are_nan_not_an_error():
    from tinn.optimizers.shampoo import inverse_fourth_root
    a = np.stack([np.eye(3, dtype=np.float32) * 16, np.full((3, 3), np.nan, np.float32)])
    roots = inverse_fourth_root(a, 0.0)
    np.testing.assert_allclose(roots[0], np.eye(3) * 0.5, rtol=1e-6)
    assert np.isnan(roots[1]).all()


def test_a_new_optimizer_is_keys_state_and_two_methods():
    """The optimizer core: KEYS, STATE, create_state() and update() make a working optimizer (heavy-ball
    momentum here, against NumPy), which wrappers, state_dict() and step_arrays() take as any other."""
    import taichi as ti
    from tinn.keys import Key, UNIT_INTERVAL
    from tinn.optimizers.optimizer import F32_1D, I32_1D, LEARNING_RATE, Optimizer, step_arrays, zeros

    @ti.kernel
    def momentum_step(P: ti.template(), po: ti.i32, G: ti.template(), go: ti.i32, n: ti.i32, v: F32_1D,
                      active: I32_1D, inv_scale: ti.f32, lr: ti.f32, lr_scale: F32_1D, mu: ti.f32):
        for k, i in ti.ndrange(active.shape[0], n):
            if active[k]:
                v[k * n + i] = mu * v[k * n + i] + G[k, go + i] * inv_scale
                P[k, po + i] -= lr * lr_scale[k] * v[k * n + i]

    class Momentum(Optimizer):
        otype = "Momentum"
        KEYS = {"learning_rate": LEARNING_RATE, "momentum": Key(0.9, UNIT_INTERVAL, "decay of the velocity")}
        STATE = ("velocity",)

        def create_state(self):
            self.velocity = zeros((self.n_instances * self.n_params,), ti.f32)

        def update(self, step):
            s = self.slot
            momentum_step(s.params, s.p_off, s.grads, s.g_off, s.n, self.velocity, step.mask, 1.0 / step.loss_scale,
                          self.learning_rate, self.lr_scale(step), self.hparams["momentum"])

    rng = np.random.default_rng(3)
    opt = Momentum(learning_rate=0.1, momentum=0.5)
    with pytest.raises(ValueError, match="'momentum'"):
        Momentum(momentum=float("nan"))
    params, ref, v = rng.random((2, 5), dtype=np.float32), None, np.zeros((2, 5))
    ref = params.astype(np.float64)
    for _ in range(3):
        grads = rng.random((2, 5), dtype=np.float32)
        step_arrays(opt, params, grads, active=[1])
        v[1] = 0.5 * v[1] + grads[1]
        ref[1] -= 0.1 * v[1]
    np.testing.assert_allclose(params, ref, rtol=1e-6)
    assert list(opt.step_counts()) == [0, 3] and set(opt.state_dict()) == {"current_step", "velocity"}

    ema = tinn.optimizers.EMA(Momentum(learning_rate=0.1), decay=0.5)
    ema.step(params, np.ones_like(params))
    assert set(ema.state_dict()) == {"weights_ema", "nested.current_step", "nested.velocity"}
    twin = tinn.optimizers.EMA(Momentum(learning_rate=0.1), decay=0.5)
    twin.step(params.copy(), np.zeros_like(params))
    twin.load_state_dict(ema.state_dict())
    for key, value in ema.state_dict().items():
        np.testing.assert_array_equal(twin.state_dict()[key], value)


def test_composite_is_a_full_optimizer():
    """Composite runs the optimizer constructor like every other optimizer (hyperparameters, runtime)."""
    model = tinn.create_from_config(2, 1, {"encoding": {"otype": "Identity"},
                                           "network": {"n_neurons": 16, "n_hidden_layers": 0}})
    n = model.network.n_params
    opt = tinn.create_optimizer({"otype": "Composite", "nested": [{"otype": "SGD", "n_params_to_optimize": n},
                                                                  {"otype": "Ema", "n_params_to_optimize": 0}]})
    assert opt.hparams == {} and opt.learning_rate == 1.0 and opt.hyperparams()["otype"] == "Composite"
    trainer = tinn.Trainer(model.network, opt, model.loss)
    trainer.training_step(np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32))
    assert list(opt.step_counts()) == [1]
    assert {k.split(".")[0] for k in opt.state_dict()} == {"base_learning_rates", "learning_rate_factor", "nested"}
