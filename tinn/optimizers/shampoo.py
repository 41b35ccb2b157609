"""Shampoo (tcnn ``optimizers/shampoo.h``; Gupta et al. 2018), on the host with numpy.

Every average is bias-corrected: with ``t`` the instance's completed steps before this
one, ``avg <- beta_d avg + alpha_d x`` where ``alpha_d = (1 - d) / (1 - d^(t+1))`` and
``beta_d = d (1 - d^t) / (1 - d^(t+1))``. One step, per instance::

    g   = grad / loss_scale + l2_reg w                                  (all params)
    m1  = avg_beta1(g),  m2 = avg_beta2(g^2),  M = m1 / (sqrt(m2) + eps)
    per weight matrix W (rows x cols), X = M (cg_on_momentum) or grad / loss_scale:
        L = avg_beta3(X X^T),  R = avg_beta3(X^T X)
        from the second step on:
            S = avg_beta_shampoo(L_root M R_root)
            lr' = lr * ||M||_F / ||S||_F  (frobenius_normalization) else lr
            W = (1 - r lr') W - copysign(a lr', W) - lr' S
    non-matrix params: w = (1 - r lr) w - copysign(a lr, w) - lr M
    then refresh roots: X_root = (sym(X) (1 - identity) + identity I)^(-1/4) for the
    matrices of every shape-batch on the first step, afterwards for one batch (round
    robin over runs of equally shaped layers) every (10 if t < 100 else 200) / n_batches steps.

Simplified against tcnn: the inverse fourth roots are computed exactly (float64
eigendecomposition) instead of by a coupled Newton iteration in float32/TF32, and the
step runs on the host with numpy (parameters and gradients are copied out of and back
into the Taichi fields each step), so it is meant for small models. Being a host computation, it
reads the step's mask and its step counts back even on the device path (one wait per step). tcnn only builds
Shampoo with cuBLAS/cuSolver and cannot serialize it; tinn can (``state_dict``).
State: ``current_step``, ``first_moments``, ``second_moments``, ``shampoo_momentum``,
and per layer ``L.<j>``, ``R.<j>``, ``L_root.<j>``, ``R_root.<j>``.
"""
import numpy as np

from ..batch.batch import host
from ..keys import CLOSED_UNIT, Key
from ..registry import optimizers
from .optimizer import ABSOLUTE_DECAY, EPSILON, LEARNING_RATE, RELATIVE_DECAY, Optimizer, beta, l2_reg


def inverse_fourth_root(a: np.ndarray, identity: float) -> np.ndarray:
    """``(sym(a) (1 - identity) + identity I)^(-1/4)`` for a stack of square matrices.

    A matrix with non-finite entries (from non-finite gradients) gives a NaN root, so the NaN
    reaches the weights as with every other optimizer instead of stopping the step halfway.
    """
    a = a.astype(np.float64)
    a = 0.5 * (a + np.swapaxes(a, -1, -2)) * (1.0 - identity) + identity * np.eye(a.shape[-1])
    out = np.full(a.shape, np.nan, np.float32)
    finite = np.isfinite(a).all(axis=(-2, -1))
    if finite.any():
        w, v = np.linalg.eigh(a[finite])
        w = np.maximum(w, np.finfo(np.float64).tiny) ** -0.25
        out[finite] = (v * w[..., None, :]) @ np.swapaxes(v, -1, -2)
    return out


def _decay(w, r, a):
    return (1 - r) * w - np.copysign(a, w)


@optimizers.register("Shampoo")
class Shampoo(Optimizer):
    otype = "Shampoo"
    KEYS = {"learning_rate": LEARNING_RATE, "beta1": beta(0.9, "first-moment decay"),
            "beta2": beta(0.99, "second-moment decay"), "beta3": beta(0.9, "decay of the preconditioner statistics"),
            "beta_shampoo": beta(0.9, "decay of the preconditioned momentum"), "epsilon": EPSILON,
            "identity": Key(0.01, CLOSED_UNIT, "weight of the identity mixed into the statistics"),
            "cg_on_momentum": Key(True, doc="statistics of the momentum (else of the raw gradient)"),
            "l2_reg": l2_reg(1e-5), "relative_decay": RELATIVE_DECAY, "absolute_decay": ABSOLUTE_DECAY,
            "frobenius_normalization": Key(True, doc="rescale the step to the momentum's Frobenius norm")}

    def create_state(self):
        K, n = self.n_instances, self.n_params
        zeros = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
        self.first_moments, self.second_moments = zeros(K, n), zeros(K, n)
        self.shampoo_momentum = zeros(K, self.n_matrix)
        rows, cols = [r for r, _ in self.layer_sizes], [c for _, c in self.layer_sizes]
        self.L, self.L_root = [zeros(K, r, r) for r in rows], [zeros(K, r, r) for r in rows]
        self.R, self.R_root = [zeros(K, c, c) for c in cols], [zeros(K, c, c) for c in cols]
        self.batches = []                                   # runs of equally shaped layers
        for j, shape in enumerate(self.layer_sizes):
            if j and shape == self.layer_sizes[j - 1]:
                self.batches[-1].append(j)
            else:
                self.batches.append([j])

    def state_arrays(self):
        if not self.n_params:
            return {}
        state = {"first_moments": self.first_moments, "second_moments": self.second_moments,
                 "shampoo_momentum": self.shampoo_momentum}
        for name in ("L", "R", "L_root", "R_root"):                 # one matrix per layer
            state.update({f"{name}.{j}": a for j, a in enumerate(getattr(self, name))})
        return state

    def _averages(self, decay, t):
        """Debiased ``(alpha, beta)`` per instance for completed steps ``t`` (tcnn's ``debiased_alpha_beta``)."""
        d = np.float32(decay)
        debias = np.float32(1) - d ** (t + 1).astype(np.float32)
        alpha = (np.float32(1) - d) / debias
        beta = d * (np.float32(1) - d ** t.astype(np.float32)) / debias
        return alpha.astype(np.float32), beta.astype(np.float32)

    def update(self, step):
        """The step on host copies of the state: all of it, or (an exception on the way) none of it."""
        saved = {name: a.copy() for name, a in self.state_arrays().items()}
        try:
            self._update(step)
        except BaseException:
            for name, a in self.state_arrays().items():
                a[...] = saved[name]
            raise

    def _update(self, step):
        """Changes the host state, then the parameters in its last line."""
        rows = np.flatnonzero(host(step.mask))
        if not len(rows):
            return
        h, s, loss_scale = self.hparams, self.slot, step.loss_scale
        lr = np.float32(self.learning_rate) * host(self.lr_scale(step))
        steps = self._steps.to_numpy()
        params = s.read(s.params, s.p_off)
        w = params[rows]
        raw = s.read(s.grads, s.g_off)[rows] / np.float32(loss_scale)
        g = raw + np.float32(h["l2_reg"]) * w
        t = steps[rows] - 1
        col = lambda a: a[:, None]                                  # noqa: E731
        mat = lambda a: a[:, None, None]                            # noqa: E731
        a1, b1 = self._averages(h["beta1"], t)
        a2, b2 = self._averages(h["beta2"], t)
        a3, b3 = self._averages(h["beta3"], t)
        ash, bsh = self._averages(h["beta_shampoo"], t)
        m1 = col(b1) * self.first_moments[rows] + col(a1) * g
        m2 = col(b2) * self.second_moments[rows] + col(a2) * g * g
        self.first_moments[rows], self.second_moments[rows] = m1, m2
        momentum = m1 / (np.sqrt(m2) + np.float32(h["epsilon"]))
        rel, absd = np.float32(h["relative_decay"]), np.float32(h["absolute_decay"])
        lr = lr[rows]
        new = w.copy()
        later = t > 0                                               # roots exist from the second step on
        off = 0
        for j, (r, c) in enumerate(self.layer_sizes):
            sl = slice(off, off + r * c)
            M = momentum[:, sl].reshape(-1, r, c)
            X = M if h["cg_on_momentum"] else raw[:, sl].reshape(-1, r, c)
            self.L[j][rows] = mat(b3) * self.L[j][rows] + mat(a3) * (X @ np.swapaxes(X, 1, 2))
            self.R[j][rows] = mat(b3) * self.R[j][rows] + mat(a3) * (np.swapaxes(X, 1, 2) @ X)
            if later.any():
                u = rows[later]
                S = self.L_root[j][u] @ M[later] @ self.R_root[j][u]
                S = mat(ash[later]) * S + mat(bsh[later]) * self.shampoo_momentum[u, sl].reshape(-1, r, c)
                S = S.reshape(len(u), -1)
                self.shampoo_momentum[u, sl] = S
                step_lr = lr[later]
                if h["frobenius_normalization"]:
                    s_norm = np.sqrt(np.sum(S * S, axis=1))
                    m_norm = np.sqrt(np.sum(M[later].reshape(len(u), -1) ** 2, axis=1))
                    step_lr = step_lr * np.where(s_norm > 0, m_norm / np.where(s_norm > 0, s_norm, 1), 1)
                step_lr = col(step_lr.astype(np.float32))
                new[later, sl] = _decay(w[later, sl], rel * step_lr, absd * step_lr) - step_lr * S
            off += r * c
        nm = slice(self.n_matrix, self.n_params)
        new[:, nm] = _decay(w[:, nm], rel * col(lr), absd * col(lr)) - col(lr) * momentum[:, nm]
        params[rows] = new
        self._refresh_roots(rows, steps[rows])
        s.write(s.params, s.p_off, params)

    def _refresh_roots(self, rows, T):
        nb = len(self.batches)
        every = np.maximum(np.where(T < 100, 10, 200) // nb, 1)
        for b, layers in enumerate(self.batches):
            need = (T == 1) | ((T % every == 0) & ((T // every) % nb == b))
            if need.any():
                u = rows[need]
                for j in layers:
                    self.L_root[j][u] = inverse_fourth_root(self.L[j][u], self.hparams["identity"])
                    self.R_root[j][u] = inverse_fourth_root(self.R[j][u], self.hparams["identity"])
