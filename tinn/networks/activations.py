"""tcnn's activations, each written once: its value, first and second derivative as
``ti.func``s for kernels and as numpy functions for the host batch path, in one record per name.

tinn differentiates every activation from its pre-activation ``z``, which gives the true
derivative everywhere, including ``Sine`` and ``SiLU`` as output activations (tcnn passes their
gradient through unchanged there). The piecewise-linear ones (``None``, ``ReLU``,
``LeakyReLU``) are differentiated from their output on the host (no pre-activation is kept);
their second derivative is 0. Softplus and Squareplus are rescaled by ``K_ACT = 10`` as in tcnn.
With ``s = sigmoid``, ``X = 10 z``, ``r = sqrt(X^2 + 4)``:

============  ===========================  ==========================  ============================
name          act(z)                       act'(z)                     act''(z)
============  ===========================  ==========================  ============================
None          z                            1                           0
ReLU          max(z, 0)                    [z > 0]                     0
LeakyReLU     z if z > 0 else 0.01 z       1 if z > 0 else 0.01        0
SiLU          z s(z)                       s + z s (1 - s)             s (1 - s) (2 + z (1 - 2 s))
Exponential   e^z                          e^z                         e^z
Sine          sin z                        cos z                       -sin z
Sigmoid       s(z)                         s (1 - s)                   s (1 - s) (1 - 2 s)
Squareplus    (X + r) / 20                 (1 + X / r) / 2             20 / r^3
Softplus      ln(1 + e^X) / 10             s(X)                        10 s(X) (1 - s(X))
Tanh          tanh z                       1 - tanh^2 z                -2 tanh z (1 - tanh^2 z)
============  ===========================  ==========================  ============================
"""
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import taichi as ti

K_ACT = 10.0


@dataclass(frozen=True)
class Activation:
    """One activation: ``value``, ``derivative``, ``second`` are ``ti.func (z) -> f32``; the ``host_*`` are
    their numpy forms on float32 arrays. ``host_derivative`` takes the output if ``from_output``, else
    the pre-activation; ``host_second`` is ``None`` where act'' is 0."""

    name: str
    value: Any
    derivative: Any
    second: Any
    host_value: Callable
    host_derivative: Callable
    host_second: Callable | None = None
    from_output: bool = False


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _leaky_slope(a):
    """1 where a > 0, else 0.01: LeakyReLU's slope, from its input or (same sign) its output."""
    return np.where(a > 0.0, np.float32(1.0), np.float32(0.01))


@ti.func
def _zero(z):
    return 0.0


@ti.func
def _one(z):
    return 1.0


@ti.func
def _identity(z):
    return z


@ti.func
def sigmoid(z):
    return 1.0 / (1.0 + ti.exp(-z))


# -- ReLU, LeakyReLU --
@ti.func
def _relu(z):
    return ti.max(z, 0.0)


@ti.func
def _relu_d(z):
    return ti.select(z > 0.0, 1.0, 0.0)


@ti.func
def _leaky(z):
    return ti.select(z > 0.0, z, 0.01 * z)


@ti.func
def _leaky_d(z):
    return ti.select(z > 0.0, 1.0, 0.01)


# -- SiLU --
@ti.func
def _silu(z):
    return z * sigmoid(z)


@ti.func
def _silu_d(z):
    s = sigmoid(z)
    return s + z * s * (1.0 - s)


@ti.func
def _silu_dd(z):
    s = sigmoid(z)
    return s * (1.0 - s) * (2.0 + z * (1.0 - 2.0 * s))


def _host_silu_d(z):
    s = _sigmoid(z)
    return s + z * s * (1.0 - s)


def _host_silu_dd(z):
    s = _sigmoid(z)
    return s * (1.0 - s) * (2.0 + z * (1.0 - 2.0 * s))


# -- Exponential, Sine --
@ti.func
def _exp(z):
    return ti.exp(z)


@ti.func
def _sin(z):
    return ti.sin(z)


@ti.func
def _cos(z):
    return ti.cos(z)


@ti.func
def _minus_sin(z):
    return -ti.sin(z)


# -- Sigmoid --
@ti.func
def _sigmoid_d(z):
    s = sigmoid(z)
    return s * (1.0 - s)


@ti.func
def _sigmoid_dd(z):
    s = sigmoid(z)
    return s * (1.0 - s) * (1.0 - 2.0 * s)


def _host_sigmoid_d(z):
    s = _sigmoid(z)
    return s * (1.0 - s)


def _host_sigmoid_dd(z):
    s = _sigmoid(z)
    return s * (1.0 - s) * (1.0 - 2.0 * s)


# -- Squareplus: X = 10 z, r = sqrt(X^2 + 4) --
@ti.func
def _squareplus(z):
    X = K_ACT * z
    return 0.5 * (X + ti.sqrt(X * X + 4.0)) / K_ACT


@ti.func
def _squareplus_d(z):
    X = K_ACT * z
    return 0.5 * (1.0 + X / ti.sqrt(X * X + 4.0))


@ti.func
def _squareplus_dd(z):
    X = K_ACT * z
    r = ti.sqrt(X * X + 4.0)
    return 2.0 * K_ACT / (r * r * r)


def _host_squareplus(z):
    X = K_ACT * z
    return 0.5 * (X + np.sqrt(X * X + 4.0)) / K_ACT


def _host_squareplus_d(z):
    X = K_ACT * z
    return 0.5 * (1.0 + X / np.sqrt(X * X + 4.0))


def _host_squareplus_dd(z):
    X = K_ACT * z
    return 2.0 * K_ACT / np.sqrt(X * X + 4.0) ** 3


# -- Softplus: ln(1 + e^(10 z)) / 10, written so that it cannot overflow --
@ti.func
def _softplus(z):
    X = K_ACT * z
    return (ti.max(X, 0.0) + ti.log(1.0 + ti.exp(-ti.abs(X)))) / K_ACT


@ti.func
def _softplus_d(z):
    return sigmoid(K_ACT * z)


@ti.func
def _softplus_dd(z):
    s = sigmoid(K_ACT * z)
    return K_ACT * s * (1.0 - s)


def _host_softplus(z):
    X = K_ACT * z
    return (np.maximum(X, 0.0) + np.log1p(np.exp(-np.abs(X)))) / K_ACT


def _host_softplus_dd(z):
    s = _sigmoid(K_ACT * z)
    return K_ACT * s * (1.0 - s)


# -- Tanh --
@ti.func
def _tanh(z):
    return ti.tanh(z)


@ti.func
def _tanh_d(z):
    t = ti.tanh(z)
    return 1.0 - t * t


@ti.func
def _tanh_dd(z):
    t = ti.tanh(z)
    return -2.0 * t * (1.0 - t * t)


def _host_tanh_dd(z):
    t = np.tanh(z)
    return -2.0 * t * (1.0 - t * t)


ACTIVATIONS = {a.name: a for a in [
    Activation("None", _identity, _one, _zero, lambda z: z, lambda h: np.float32(1.0), from_output=True),
    Activation("ReLU", _relu, _relu_d, _zero, lambda z: np.maximum(z, np.float32(0.0), out=z), lambda h: h > 0.0,
               from_output=True),
    Activation("LeakyReLU", _leaky, _leaky_d, _zero, lambda z: np.multiply(z, _leaky_slope(z), out=z), _leaky_slope,
               from_output=True),
    Activation("SiLU", _silu, _silu_d, _silu_dd, lambda z: z * _sigmoid(z), _host_silu_d, _host_silu_dd),
    Activation("Exponential", _exp, _exp, _exp, np.exp, np.exp, np.exp),
    Activation("Sine", _sin, _cos, _minus_sin, np.sin, np.cos, lambda z: -np.sin(z)),
    Activation("Sigmoid", sigmoid, _sigmoid_d, _sigmoid_dd, _sigmoid, _host_sigmoid_d, _host_sigmoid_dd),
    Activation("Squareplus", _squareplus, _squareplus_d, _squareplus_dd, _host_squareplus, _host_squareplus_d,
               _host_squareplus_dd),
    Activation("Softplus", _softplus, _softplus_d, _softplus_dd, _host_softplus, lambda z: _sigmoid(K_ACT * z),
               _host_softplus_dd),
    Activation("Tanh", _tanh, _tanh_d, _tanh_dd, np.tanh, lambda z: 1.0 - np.tanh(z) ** 2, _host_tanh_dd),
]}

NAMES = tuple(ACTIVATIONS)


@ti.func
def value(name: ti.template(), z):
    """act(z) for the activation ``name`` (a compile-time string)."""
    return ti.static(ACTIVATIONS[name].value)(z)


@ti.func
def derivative(name: ti.template(), z):
    """act'(z) for the activation ``name``."""
    return ti.static(ACTIVATIONS[name].derivative)(z)


@ti.func
def second_derivative(name: ti.template(), z):
    """act''(z) for the activation ``name``."""
    return ti.static(ACTIVATIONS[name].second)(z)


# -- host arrays (float32 numpy, inside tinn's BLAS workers) --
def host_value(act: Activation, z: np.ndarray, zeros: np.ndarray | None = None) -> np.ndarray:
    """act(z); in place (returns ``z``) for the ``from_output`` activations. ``zeros``: float32 zeros, at least
    ``z.size`` of them, that ReLU takes its maximum with (numpy's float32 maximum runs about 3x faster
    against an array of zeros than against a scalar 0: its contiguous SIMD loop)."""
    if zeros is not None and act.name == "ReLU":
        return np.maximum(z, zeros[: z.size].reshape(z.shape), out=z)
    with np.errstate(over="ignore", invalid="ignore"):
        return act.host_value(z)


def host_times_derivative(act: Activation, a: np.ndarray, g: np.ndarray):
    """``g *= act'``, from the output ``a`` (``from_output`` activations) or the pre-activation ``a``."""
    if act.name != "None":
        with np.errstate(over="ignore", invalid="ignore"):
            g *= act.host_derivative(a)


def host_derivative(act: Activation, a: np.ndarray) -> np.ndarray | None:
    """act' as an array (from the output or the pre-activation ``a``, as ``host_times_derivative``);
    ``None`` for the identity."""
    if act.name == "None":
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return act.host_derivative(a)


def host_second(act: Activation, z: np.ndarray) -> np.ndarray:
    """act''(z) of the pre-activation (only asked for activations with ``host_second``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return act.host_second(z).astype(np.float32, copy=False)
