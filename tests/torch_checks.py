"""Finite-difference checks for ``tinn.torch`` modules (shared by the first- and second-order tests).

tinn computes in float32, so derivatives are checked along random directions with central differences
of a float64 objective, ``(L(p + h d) - L(p - h d)) / 2h`` against ``<dL/dp, d>``, with tolerances
stated per call.
"""
import numpy as np
import torch


def directional(f, t: torch.Tensor, d: torch.Tensor, h: float) -> float:
    """Central difference of ``f()`` when ``t`` moves by ``h d`` (``t`` restored afterwards)."""
    saved = t.detach().clone()
    values = []
    for step in (h, -h):
        with torch.no_grad():
            t.copy_(saved + step * d)
        values.append(float(f()))
    with torch.no_grad():
        t.copy_(saved)
    return (values[0] - values[1]) / (2 * h)


def output_weights(module, x, instance=None, seed=0):
    """Fixed random float64 weights ``w`` for ``L = sum(w * module(x))``."""
    with torch.no_grad():
        shape = module(x, instance=instance).shape if instance is not None else module(x).shape
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape))


def call(module, x, instance=None):
    return module(x) if instance is None else module(x, instance=instance)


def assert_close(analytic: float, numeric: float, rtol: float, atol: float, what: str):
    assert abs(analytic - numeric) <= atol + rtol * abs(numeric), \
        f"{what}: analytic {analytic:.6g} vs finite difference {numeric:.6g}"


def check_first_order(module, x, instance=None, h=1e-3, rtol=2e-2, atol=1e-4, seed=0):
    """dL/dparams and dL/dx of ``L = sum(w * module(x))`` against central differences."""
    gen = torch.Generator().manual_seed(seed)
    x = x.detach().clone().double().requires_grad_(True)
    w = output_weights(module, x, instance, seed)

    def loss():
        with torch.no_grad():
            return (call(module, x, instance).double() * w).sum()

    module.zero_grad()
    (call(module, x, instance).double() * w).sum().backward()
    dp = torch.randn(module.params.shape, generator=gen, dtype=torch.float64).float()
    dx = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    assert module.params.grad is not None and x.grad is not None
    assert_close(float((module.params.grad.double() * dp.double()).sum()), directional(loss, module.params, dp, h),
                 rtol, atol, "dL/dparams")
    assert_close(float((x.grad * dx).sum()), directional(loss, x, dx, h), rtol, atol, "dL/dx")


def check_second_order(module, x, instance=None, h=1e-3, rtol=3e-2, atol=1e-4, seed=0):
    """Eikonal-style ``L2 = sum(v * dL/dx)`` with ``L = sum(w * module(x))``: dL2/dparams and dL2/dx through
    ``torch.autograd.grad(..., create_graph=True)`` against central differences of first-order gradients."""
    gen = torch.Generator().manual_seed(seed + 1)
    x = x.detach().clone().double().requires_grad_(True)
    w = output_weights(module, x, instance, seed)
    v = torch.randn(x.shape, generator=gen, dtype=torch.float64)

    def input_gradient(create_graph):
        y = call(module, x, instance).double()
        return torch.autograd.grad((y * w).sum(), x, create_graph=create_graph)[0]

    def loss2():
        return float((input_gradient(False) * v).sum())

    module.zero_grad()
    x.grad = None
    (input_gradient(True) * v).sum().backward()
    assert module.params.grad is not None and x.grad is not None
    dp = torch.randn(module.params.shape, generator=gen, dtype=torch.float64).float()
    dx = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    analytic_p, analytic_x = float((module.params.grad.double() * dp.double()).sum()), float((x.grad * dx).sum())
    assert_close(analytic_p, directional(loss2, module.params, dp, h), rtol, atol, "dL2/dparams")
    assert_close(analytic_x, directional(loss2, x, dx, h), rtol, atol, "dL2/dx")
