"""tcnn's activations (spec §2.3) as ``ti.func`` pairs: value and derivative from the pre-activation.

tinn differentiates every activation from its pre-activation ``z``, which gives the
true derivative everywhere, including ``Sine`` and ``SiLU`` as output activations
(tcnn passes their gradient through unchanged there: spec §8 A7).
Softplus and Squareplus are rescaled by ``K_ACT = 10`` as in tcnn.
"""
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
