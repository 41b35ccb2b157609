"""Every registered optimizer against an independent NumPy version of its update equations (spec §4).

TABLE holds one config per otype and a float64 NumPy reference built from the spec;
a registered otype without an entry fails the suite, so nothing is added untested.
Each entry runs a few steps on fixed gradients for an array of K = 3 networks, some of
them inactive in some steps (numpy path: ``allocate`` then ``step(w, g, active=...)``),
against one reference per network, and is checked for its hyperparams round trip,
``update_hyperparams`` and ``state_dict`` round trip.
"""
import json

import numpy as np
import pytest

import tinn

N, LAYERS, STEPS = 40, [(4, 6), (2, 4)], 6          # 32 matrix params, 8 non-matrix
N_MATRIX = sum(r * c for r, c in LAYERS)


def gradients(seed=1, steps=STEPS, n=N):
    rng = np.random.default_rng(seed)
    out = [rng.normal(size=n).astype(np.float32) for _ in range(steps)]
    for g in out[::2]:
        g[N_MATRIX + 2:N_MATRIX + 5] = 0.0                # untouched non-matrix params (sparse Adam)
    return out


def decay(w, r, a):
    return (1 - r) * w - np.copysign(a, w)


# -- NumPy references (float64), one object per optimizer, K = 1 -------------------------
class Ref:
    def __init__(self, n, layers, lr=1e-3):
        self.n, self.layers, self.lr, self.steps = n, layers, lr, 0
        self.n_matrix = sum(r * c for r, c in layers)

    def custom(self):
        return None


class SGDRef(Ref):
    def __init__(self, n, layers, lr=1e-3, l2_reg=1e-8):
        super().__init__(n, layers, lr)
        self.l2 = l2_reg

    def step(self, w, g, s=1.0):
        w -= self.lr * s * (g + self.l2 * w)
        self.steps += 1


class AdamRef(Ref):
    def __init__(self, n, layers, lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, l2_reg=1e-8):
        super().__init__(n, layers, lr)
        self.b1, self.b2, self.eps, self.l2 = beta1, beta2, epsilon, l2_reg
        self.m, self.v, self.t = np.zeros(n), np.zeros(n), np.zeros(n)

    def step(self, w, g, s=1.0):
        matrix = np.arange(self.n) < self.n_matrix
        run = matrix | (g != 0)
        g = g + np.where(matrix, self.l2, 0.0) * w
        self.m = np.where(run, self.b1 * self.m + (1 - self.b1) * g, self.m)
        self.v = np.where(run, self.b2 * self.v + (1 - self.b2) * g * g, self.v)
        self.t = self.t + run
        t = np.maximum(self.t, 1)
        a_t = self.lr * s * np.sqrt(1 - self.b2 ** t) / (1 - self.b1 ** t)
        w[...] = np.where(run, w - a_t / (np.sqrt(self.v) + self.eps) * self.m, w)
        self.steps += 1


class NovogradRef(Ref):
    def __init__(self, n, layers, lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, relative_decay=0.0,
                 absolute_decay=0.0):
        super().__init__(n, layers, lr)
        self.b1, self.b2, self.eps, self.r, self.a = beta1, beta2, epsilon, relative_decay, absolute_decay
        self.m, self.v = np.zeros(n), np.zeros(len(layers))

    def step(self, w, g, s=1.0):
        self.steps += 1
        first = self.steps == 1
        b1, b2, lr = (0.0 if first else self.b1), (0.0 if first else self.b2), self.lr * s
        off = 0
        for l, (r, c) in enumerate(self.layers):
            sl = slice(off, off + r * c)
            self.v[l] = b2 * self.v[l] + (1 - b2) * np.sum(g[sl] ** 2)
            self.m[sl] = b1 * self.m[sl] + (1 - b1) * g[sl] / (np.sqrt(self.v[l]) + self.eps)
            w[sl] = decay(w[sl], self.r * lr, self.a * lr) - lr * self.m[sl]
            off += r * c


def inv4(a, identity):
    a = 0.5 * (a + a.T) * (1 - identity) + identity * np.eye(len(a))
    lam, vec = np.linalg.eigh(a)
    return vec @ np.diag(lam ** -0.25) @ vec.T


class ShampooRef(Ref):
    def __init__(self, n, layers, lr=1e-3, beta1=0.9, beta2=0.99, beta3=0.9, beta_shampoo=0.9, epsilon=1e-8,
                 identity=0.01, cg_on_momentum=True, l2_reg=1e-5, frobenius_normalization=True):
        super().__init__(n, layers, lr)
        self.b = dict(b1=beta1, b2=beta2, b3=beta3, bs=beta_shampoo)
        self.eps, self.id, self.cg, self.l2, self.frob = epsilon, identity, cg_on_momentum, l2_reg, \
            frobenius_normalization
        self.m1, self.m2, self.S = np.zeros(n), np.zeros(n), np.zeros(self.n_matrix)
        self.L = [np.zeros((r, r)) for r, _ in layers]
        self.R = [np.zeros((c, c)) for _, c in layers]
        self.Lr, self.Rr = [x.copy() for x in self.L], [x.copy() for x in self.R]
        self.batches = [[0], [1]]                         # the two test layers differ in shape

    def step(self, w, g, s=1.0):
        t = self.steps

        def avg(old, new, d):
            deb = 1 - d ** (t + 1)
            return d * (1 - d ** t) / deb * old + (1 - d) / deb * new

        gl = g + self.l2 * w
        self.m1, self.m2 = avg(self.m1, gl, self.b["b1"]), avg(self.m2, gl * gl, self.b["b2"])
        M = self.m1 / (np.sqrt(self.m2) + self.eps)
        lr, new, off = self.lr * s, w.copy(), 0
        for j, (r, c) in enumerate(self.layers):
            sl = slice(off, off + r * c)
            Mj = M[sl].reshape(r, c)
            X = Mj if self.cg else g[sl].reshape(r, c)
            self.L[j], self.R[j] = avg(self.L[j], X @ X.T, self.b["b3"]), avg(self.R[j], X.T @ X, self.b["b3"])
            if t > 0:
                S = avg(self.S[sl].reshape(r, c), self.Lr[j] @ Mj @ self.Rr[j], self.b["bs"])
                self.S[sl] = S.ravel()
                lr_j = lr * np.linalg.norm(Mj) / np.linalg.norm(S) if self.frob else lr
                new[sl] = w[sl] - lr_j * S.ravel()
            off += r * c
        new[self.n_matrix:] = w[self.n_matrix:] - lr * M[self.n_matrix:]
        w[...] = new
        self.steps = T = t + 1
        every = max((10 if T < 100 else 200) // len(self.batches), 1)
        for b, layers in enumerate(self.batches):
            if T == 1 or (T % every == 0 and (T // every) % len(self.batches) == b):
                for j in layers:
                    self.Lr[j], self.Rr[j] = inv4(self.L[j], self.id), inv4(self.R[j], self.id)


class WrapperRef(Ref):
    def __init__(self, nested):
        self.nested = nested

    @property
    def steps(self):
        return self.nested.steps

    def custom(self):
        return self.nested.custom()


class EMARef(WrapperRef):
    def __init__(self, nested, w0, decay=0.99):
        super().__init__(nested)
        self.d, self.E = decay, w0.astype(np.float64).copy()

    def step(self, w, g, s=1.0):
        self.nested.step(w, g, s)
        t, d = self.steps, self.d
        src = self.nested.custom() if self.nested.custom() is not None else w
        self.E = (d * (1 - d ** (t - 1)) * self.E + (1 - d) * src) / (1 - d ** t)

    def custom(self):
        return self.E


class AverageRef(WrapperRef):
    def __init__(self, nested, n, n_samples=128):
        super().__init__(nested)
        self.N, self.avg, self.snaps = n_samples, np.zeros(n), np.zeros((n_samples, n))

    def step(self, w, g, s=1.0):
        self.nested.step(w, g, s)
        j = self.steps % self.N
        self.avg = self.avg + (w - self.snaps[j]) / self.N
        self.snaps[j] = w

    def custom(self):
        return self.avg


class BatchedRef(WrapperRef):
    def __init__(self, nested, n, batch_size_multiplier=16):
        super().__init__(nested)
        self.N, self.calls, self.pool = batch_size_multiplier, 0, np.zeros(n)

    @property
    def steps(self):
        return self.calls

    def step(self, w, g, s=1.0):
        if self.calls % self.N == 0:
            self.pool[:] = 0
        self.pool += g / self.N
        self.calls += 1
        if self.calls % self.N == 0:
            self.nested.step(w, self.pool, s)


class ExpDecayRef(WrapperRef):
    def __init__(self, nested, decay_base=0.1, decay_start=10000, decay_interval=10000, decay_end=10000000):
        super().__init__(nested)
        self.base, self.start, self.interval, self.end, self.factor = decay_base, decay_start, decay_interval, \
            decay_end, 1.0

    def step(self, w, g, s=1.0):
        n = self.steps
        if n == 0:
            self.factor = 1.0
        if n >= self.start and (n - self.start) % self.interval == 0 and n <= self.end:
            self.factor *= self.base
        self.nested.step(w, g, s * self.factor)


class LookaheadRef(WrapperRef):
    def __init__(self, nested, w0, alpha=0.5, n_steps=16):
        super().__init__(nested)
        self.alpha, self.k, self.slow = alpha, n_steps, w0.astype(np.float64).copy()

    def step(self, w, g, s=1.0):
        if self.steps == 0:
            self.slow = w.copy()
        if self.steps % self.k == 0:
            w[...] = (1 - self.alpha) * self.slow + self.alpha * w
            self.slow = w.copy()
        self.nested.step(w, g, s)

    def custom(self):
        return self.slow


class CompositeRef(Ref):
    def __init__(self, parts):                       # [(ref, n_params)]
        self.parts, self.w = parts, None

    @property
    def steps(self):
        return self.parts[0][0].steps

    def step(self, w, g, s=1.0):
        off = 0
        for ref, n in self.parts:
            ref.step(w[off:off + n], g[off:off + n], s)
            off += n
        self.w = w

    def custom(self):
        out, off = self.w.copy(), 0
        for ref, n in self.parts:
            if ref.custom() is not None:
                out[off:off + n] = ref.custom()
            off += n
        return out


ADAM = {"otype": "Adam", "learning_rate": 0.05, "beta2": 0.99}

TABLE = {
    "SGD": ({"otype": "SGD", "learning_rate": 0.05, "l2_reg": 0.01},
            lambda w0: SGDRef(N, LAYERS, lr=0.05, l2_reg=0.01)),
    "Adam": (ADAM, lambda w0: AdamRef(N, LAYERS, lr=0.05, beta2=0.99)),
    "Novograd": ({"otype": "Novograd", "learning_rate": 0.05, "beta1": 0.8, "relative_decay": 0.1,
                  "absolute_decay": 0.01},
                 lambda w0: NovogradRef(N, LAYERS, lr=0.05, beta1=0.8, relative_decay=0.1, absolute_decay=0.01)),
    "Shampoo": ({"otype": "Shampoo", "learning_rate": 0.05, "l2_reg": 1e-3},
                lambda w0: ShampooRef(N, LAYERS, lr=0.05, l2_reg=1e-3)),
    "Ema": ({"otype": "EMA", "decay": 0.9, "nested": ADAM},
            lambda w0: EMARef(AdamRef(N, LAYERS, lr=0.05, beta2=0.99), w0, decay=0.9)),
    "Average": ({"otype": "Average", "n_samples": 4, "nested": ADAM},
                lambda w0: AverageRef(AdamRef(N, LAYERS, lr=0.05, beta2=0.99), N, n_samples=4)),
    "Batched": ({"otype": "Batched", "batch_size_multiplier": 2, "nested": ADAM},
                lambda w0: BatchedRef(AdamRef(N, LAYERS, lr=0.05, beta2=0.99), N, batch_size_multiplier=2)),
    "ExponentialDecay": ({"otype": "ExponentialDecay", "decay_base": 0.5, "decay_start": 2, "decay_interval": 2,
                          "decay_end": 4, "nested": {"otype": "SGD", "learning_rate": 0.05}},
                         lambda w0: ExpDecayRef(SGDRef(N, LAYERS, lr=0.05), 0.5, 2, 2, 4)),
    "Lookahead": ({"otype": "Lookahead", "alpha": 0.3, "n_steps": 2, "nested": ADAM},
                  lambda w0: LookaheadRef(AdamRef(N, LAYERS, lr=0.05, beta2=0.99), w0, alpha=0.3, n_steps=2)),
    "Composite": ({"otype": "Composite", "nested": [
                      {**ADAM, "n_params_to_optimize": 24},
                      {"otype": "Novograd", "learning_rate": 0.05, "n_params_to_optimize": 8},
                      {"otype": "Ema", "decay": 0.9, "nested": {"otype": "SGD", "learning_rate": 0.05},
                       "n_params_to_optimize": 6}]},
                  lambda w0: CompositeRef([(AdamRef(24, [(4, 6)], lr=0.05, beta2=0.99), 24),
                                           (NovogradRef(8, [(2, 4)], lr=0.05), 8),
                                           (EMARef(SGDRef(6, [], lr=0.05), w0[32:38], decay=0.9), 6)])),
}
NAMES = sorted(TABLE)
WITH_INFERENCE_WEIGHTS = {"Ema", "Average", "Lookahead", "Composite"}


def test_every_registered_optimizer_is_tested():
    registered = set(tinn.registry.optimizers.names())
    assert registered == set(TABLE), f"untested otypes: {sorted(registered - set(TABLE))}; " \
                                     f"stale entries: {sorted(set(TABLE) - registered)}"


def make(name, n=N, layers=LAYERS, k=1):
    opt = tinn.create_optimizer(TABLE[name][0])
    opt.allocate(n, layers, k)
    return opt


def w_init(k=None):
    rng = np.random.default_rng(7)
    shape = (N,) if k is None else (k, N)
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


K = 3
ACTIVE = [None, [0, 2], None, [0, 2], [1, 2], None]       # None: all networks have samples


def array_gradients(seed=1):
    return [np.stack([g, -g[::-1], 0.5 * g]) for g in gradients(seed, steps=len(ACTIVE))]


@pytest.mark.parametrize("name", NAMES)
def test_steps_match_numpy_reference_per_network(name):
    """K = 3 networks stepped jointly equal the reference stepped alone on each network's
    gradients; a network without samples in a step is left exactly as it was."""
    w0 = w_init(K)
    opt, refs = make(name, k=K), [TABLE[name][1](w0[k]) for k in range(K)]
    w, w_ref = w0.copy(), w0.astype(np.float64)
    tol = dict(rtol=2e-4, atol=2e-5) if name == "Shampoo" else dict(rtol=2e-5, atol=2e-6)
    for i, (g, active) in enumerate(zip(array_gradients(), ACTIVE)):
        before = w.copy(), opt.custom_weights()
        opt.step(w, g, active=active)
        for k in range(K):
            if active is None or k in active:
                refs[k].step(w_ref[k], g[k].astype(np.float64))
            else:
                assert np.array_equal(w[k], before[0][k])
                if before[1] is not None:
                    assert np.array_equal(opt.custom_weights()[k], before[1][k])
            msg = f"{name} step {i + 1} network {k}"
            np.testing.assert_allclose(w[k], w_ref[k], **tol, err_msg=msg)
            if name in WITH_INFERENCE_WEIGHTS:
                np.testing.assert_allclose(opt.custom_weights()[k], refs[k].custom(), **tol, err_msg=msg)
        assert list(opt.step_counts()) == [r.steps for r in refs]
    assert opt.custom_weights() is None or name in WITH_INFERENCE_WEIGHTS
    assert not np.array_equal(w, w0)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_resumes_bit_identically(name):
    grads = array_gradients(seed=2)
    a, w = make(name, k=K), w_init(K)
    for g, active in zip(grads[:4], ACTIVE):
        a.step(w, g, active=active)
    b = tinn.create_optimizer(a.hyperparams())
    b.allocate(N, LAYERS, K)
    b.load_state_dict(a.state_dict())
    assert list(b.step_counts()) == list(a.step_counts())
    w_b = w.copy()
    for g, active in zip(grads[4:], ACTIVE[4:]):
        a.step(w, g, active=active)
        b.step(w_b, g, active=active)
    np.testing.assert_array_equal(w, w_b)
    state_a, state_b = a.state_dict(), b.state_dict()
    assert state_a.keys() == state_b.keys()
    for key, value in state_a.items():
        np.testing.assert_array_equal(value, state_b[key], err_msg=key)
    bad = dict(state_a)
    key = sorted(bad)[-1]
    bad[key] = np.zeros((7, 3), np.float32)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        b.load_state_dict(bad)
    for k, v in state_b.items():                                     # a bad state changes nothing
        np.testing.assert_array_equal(v, b.state_dict()[k])
    with pytest.raises(ValueError, match="missing"):
        b.load_state_dict({k: v for k, v in state_a.items() if k != key})


@pytest.mark.parametrize("name", NAMES)
def test_hyperparams_round_trip_and_update(name):
    opt = tinn.create_optimizer(TABLE[name][0])
    hp = opt.hyperparams()
    assert json.loads(json.dumps(hp)) == hp
    assert tinn.create_optimizer(hp).hyperparams() == hp
    assert hp["otype"] == ("EMA" if name == "Ema" else name)
    defaults = {k: key.default for k, key in type(opt).KEYS.items()}
    assert set(defaults) <= set(hp)                                 # defaults are reported
    if "nested" in hp and name != "Composite":
        opt.update_hyperparams({"nested": {"learning_rate": 0.25}})
        assert opt.hyperparams()["nested"]["learning_rate"] == 0.25
        assert tinn.create_optimizer({"otype": name}).hyperparams()["nested"] == \
            tinn.create_optimizer({}).hyperparams()
    elif name == "Composite":
        opt.update_hyperparams({"nested": [{"learning_rate": 0.25}, {}, {"nested": {"learning_rate": 0.125}}]})
        assert opt.hyperparams()["nested"][0]["learning_rate"] == 0.25
        assert opt.hyperparams()["nested"][2]["nested"]["learning_rate"] == 0.125
    opt.update_hyperparams({"learning_rate": 0.5})
    assert opt.learning_rate == pytest.approx(0.5)
    key = next((k for k in defaults if k != "learning_rate" and not isinstance(defaults[k], bool)), None)
    if key is not None:                                             # an own key changes, the rest stays
        before = opt.hyperparams()
        value = defaults[key] + 1 if isinstance(defaults[key], int) else defaults[key] * 0.5
        opt.update_hyperparams({key: value})
        after = opt.hyperparams()
        assert after[key] == value and {k: v for k, v in after.items() if k != key} == \
            {k: v for k, v in before.items() if k != key}
        with pytest.raises(ValueError, match=key):
            opt.update_hyperparams({key: "nonsense"})
        assert opt.hyperparams() == after


# -- details not covered by the sweep --------------------------------------------------------
def test_ema_name_and_case_insensitive_lookup():
    assert tinn.create_optimizer({"otype": "ema"}).hyperparams()["otype"] == "EMA"
    assert tinn.create_optimizer({"otype": "EXPONENTIALDECAY"}).hyperparams()["otype"] == "ExponentialDecay"
    assert tinn.create_optimizer({"otype": "Ema"}).hyperparams()["nested"]["otype"] == "Adam"


def test_composite_slices_must_respect_layers():
    opt = tinn.create_optimizer({"otype": "Composite", "nested": [{"n_params_to_optimize": 20},
                                                                  {"n_params_to_optimize": 20}]})
    with pytest.raises(ValueError, match="cuts layer 0"):
        opt.allocate(N, LAYERS)
    opt = tinn.create_optimizer({"otype": "Composite", "nested": [{"n_params_to_optimize": 50}]})
    with pytest.raises(ValueError, match="sums to 50"):
        opt.allocate(N, LAYERS)
    with pytest.raises(ValueError, match="nested"):
        tinn.create_optimizer({"otype": "Composite"})


def test_learning_rate_setters_follow_tcnn():
    """ExponentialDecay: set -> base = v / factor; Composite: learning_rate is a factor on the nested rates."""
    opt = tinn.create_optimizer({"otype": "ExponentialDecay", "decay_start": 1, "decay_interval": 1,
                                 "decay_base": 0.5, "nested": {"otype": "SGD", "learning_rate": 0.1}})
    opt.allocate(4)
    w = np.ones(4, np.float32)
    for _ in range(3):
        opt.step(w, np.ones(4, np.float32))
    assert opt.learning_rate == pytest.approx(0.1 * 0.25)           # decayed at s = 1 and s = 2
    opt.learning_rate = 0.01
    assert opt.learning_rate == pytest.approx(0.01)
    assert opt.hyperparams()["nested"]["learning_rate"] == pytest.approx(0.04)   # the base
    comp = tinn.create_optimizer({"otype": "Composite", "nested": [
        {"otype": "SGD", "learning_rate": 0.1, "n_params_to_optimize": 2},
        {"otype": "SGD", "learning_rate": 0.2, "n_params_to_optimize": 2}]})
    assert comp.learning_rate == 1.0
    comp.update_hyperparams({"learning_rate": 0.5})
    assert [h["learning_rate"] for h in comp.hyperparams()["nested"]] == pytest.approx([0.05, 0.1])


# -- inference weights through a model and a Trainer ------------------------------------------
SMALL = {"loss": {"otype": "L2"}, "encoding": {"otype": "Frequency", "n_frequencies": 2},
         "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}}


@pytest.mark.parametrize("optimizer", [
    {"otype": "Ema", "decay": 0.9, "nested": {"learning_rate": 1e-2}},
    {"otype": "Average", "n_samples": 3, "nested": {"learning_rate": 1e-2}},
    {"otype": "Lookahead", "n_steps": 3, "nested": {"learning_rate": 1e-2}},
], ids=["Ema", "Average", "Lookahead"])
def test_inference_reads_the_optimizer_inference_weights(optimizer, rng):
    model = tinn.create_from_config(2, 3, {**SMALL, "optimizer": optimizer})
    x = rng.random((64, 2), dtype=np.float32)
    y = rng.random((64, 3), dtype=np.float32)
    for _ in range(4):
        model.trainer.training_step(x, y)
    inference_weights = model.trainer.params_inference()
    np.testing.assert_array_equal(inference_weights, model.optimizer.custom_weights())
    assert not np.allclose(inference_weights, model.network.params())
    plain = tinn.create_from_config(2, 3, SMALL)
    plain.network.set_params(inference_weights)
    np.testing.assert_array_equal(model.network.inference(x), plain.network.inference(x))
    out, _ = model.network.forward(x)                              # training reads the training weights
    plain.network.set_params(model.network.params())
    np.testing.assert_array_equal(out, plain.network.inference(x))
