"""tcnn's activations (spec §2.3): value and derivative from the pre-activation, as ``ti.func``s for
kernels and as numpy functions for the host batch path.

tinn differentiates every activation from its pre-activation ``z``, which gives the
true derivative everywhere, including ``Sine`` and ``SiLU`` as output activations
(tcnn passes their gradient through unchanged there: spec §8 A7).
Softplus and Squareplus are rescaled by ``K_ACT = 10`` as in tcnn.
"""
import numpy as np
import taichi as ti

K_ACT = 10.0


@ti.func
def sigmoid(z):
    return 1.0 / (1.0 + ti.exp(-z))


@ti.func
def _squareplus_y(z):                  # Y = (X + sqrt(X^2 + 4)) / 2 with X = 10 z
    X = K_ACT * z
    return 0.5 * (X + ti.sqrt(X * X + 4.0))


@ti.func
def value(name: ti.template(), z):
    """act(z) for the activation ``name`` (a compile-time string)."""
    y = z
    if ti.static(name == "ReLU"):
        y = ti.max(z, 0.0)
    elif ti.static(name == "LeakyReLU"):
        y = ti.select(z > 0.0, z, 0.01 * z)
    elif ti.static(name == "SiLU"):
        y = z * sigmoid(z)
    elif ti.static(name == "Exponential"):
        y = ti.exp(z)
    elif ti.static(name == "Sine"):
        y = ti.sin(z)
    elif ti.static(name == "Sigmoid"):
        y = sigmoid(z)
    elif ti.static(name == "Squareplus"):
        y = _squareplus_y(z) / K_ACT
    elif ti.static(name == "Softplus"):     # ln(1 + e^(10 z)) / 10, written so that it cannot overflow
        X = K_ACT * z
        y = (ti.max(X, 0.0) + ti.log(1.0 + ti.exp(-ti.abs(X)))) / K_ACT
    elif ti.static(name == "Tanh"):
        y = ti.tanh(z)
    return y


@ti.func
def derivative(name: ti.template(), z):
    """act'(z) for the activation ``name``."""
    d = 1.0
    if ti.static(name == "ReLU"):
        d = ti.select(z > 0.0, 1.0, 0.0)
    elif ti.static(name == "LeakyReLU"):
        d = ti.select(z > 0.0, 1.0, 0.01)
    elif ti.static(name == "SiLU"):
        s = sigmoid(z)
        d = s + z * s * (1.0 - s)
    elif ti.static(name == "Exponential"):
        d = ti.exp(z)
    elif ti.static(name == "Sine"):
        d = ti.cos(z)
    elif ti.static(name == "Sigmoid"):
        s = sigmoid(z)
        d = s * (1.0 - s)
    elif ti.static(name == "Squareplus"):
        Y2 = _squareplus_y(z) ** 2
        d = Y2 / (Y2 + 1.0)
    elif ti.static(name == "Softplus"):
        d = sigmoid(K_ACT * z)
    elif ti.static(name == "Tanh"):
        d = 1.0 - ti.tanh(z) ** 2
    return d


NAMES = ("None", "ReLU", "LeakyReLU", "SiLU", "Exponential", "Sine", "Sigmoid", "Squareplus", "Softplus", "Tanh")


# -- the same formulas on host arrays, for the batch path (numpy, inside tinn's BLAS workers) --
FROM_OUTPUT = ("None", "ReLU", "LeakyReLU")
"""Activations whose derivative is a function of their output: applied in place, no pre-activation kept."""


_ZEROS = np.zeros(0, np.float32)


def _host_relu(z):
    """max(z, 0) in place. numpy's float32 maximum runs about 3x faster against an array of
    zeros than against a scalar 0 (its contiguous SIMD loop), so a shared zero buffer is kept."""
    global _ZEROS
    zeros = _ZEROS                          # one read: worker threads may replace the buffer meanwhile
    if zeros.size < z.size:
        zeros = _ZEROS = np.zeros(z.size, np.float32)
    return np.maximum(z, zeros[: z.size].reshape(z.shape), out=z)


def _host_sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _host_squareplus_y(z):
    X = K_ACT * z
    return 0.5 * (X + np.sqrt(X * X + 4.0))


def _host_leaky_slope(a):
    """1 where a > 0, else 0.01: LeakyReLU's slope, from its input or (same sign) its output."""
    return np.where(a > 0.0, np.float32(1.0), np.float32(0.01))


_HOST_VALUE = {
    "None": lambda z: z,
    "ReLU": _host_relu,
    "LeakyReLU": lambda z: np.multiply(z, _host_leaky_slope(z), out=z),
    "SiLU": lambda z: z * _host_sigmoid(z),
    "Exponential": np.exp,
    "Sine": np.sin,
    "Sigmoid": _host_sigmoid,
    "Squareplus": lambda z: _host_squareplus_y(z) / K_ACT,
    "Softplus": lambda z: (np.maximum(K_ACT * z, 0.0) + np.log1p(np.exp(-np.abs(K_ACT * z)))) / K_ACT,
    "Tanh": np.tanh,
}


def _host_silu_derivative(z):
    s = _host_sigmoid(z)
    return s + z * s * (1.0 - s)


def _host_sigmoid_derivative(z):
    s = _host_sigmoid(z)
    return s * (1.0 - s)


def _host_squareplus_derivative(z):
    y2 = _host_squareplus_y(z) ** 2
    return y2 / (y2 + 1.0)


_HOST_DERIVATIVE = {                     # from the output for FROM_OUTPUT, else from the pre-activation
    "ReLU": lambda h: h > 0.0,
    "LeakyReLU": _host_leaky_slope,
    "SiLU": _host_silu_derivative,
    "Exponential": np.exp,
    "Sine": np.cos,
    "Sigmoid": _host_sigmoid_derivative,
    "Squareplus": _host_squareplus_derivative,
    "Softplus": lambda z: _host_sigmoid(K_ACT * z),
    "Tanh": lambda z: 1.0 - np.tanh(z) ** 2,
}


def host_value(name: str, z: np.ndarray) -> np.ndarray:
    """act(z) of a float32 host array; in place (returns ``z``) for the FROM_OUTPUT activations."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _HOST_VALUE[name](z)


def host_times_derivative(name: str, a: np.ndarray, g: np.ndarray):
    """``g *= act'``, from the output ``a`` (FROM_OUTPUT activations) or the pre-activation ``a``."""
    if name != "None":
        with np.errstate(over="ignore", invalid="ignore"):
            g *= _HOST_DERIVATIVE[name](a)
