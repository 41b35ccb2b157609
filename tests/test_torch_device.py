"""tinn.torch on the device path (``tinn.torch._tensors``): tensors cross to tinn by copy kernels that take
the tensor itself, never through the host.

On the CPU the device path is forced (``tinn.runtime.program.FORCE``) with CPU tensors standing in for CUDA ones
(Taichi's kernels address both directly) and checked against the host path: outputs, ``x.grad``,
``params.grad`` and Eikonal second order, and a training step that moves nothing through numpy. On any
arch the bridge is checked against tinn's native API fed numpy arrays (on Vulkan or Metal: the route
through numpy and one upload).
"""
import numpy as np
import pytest
import taichi as ti
from taichi.lang import impl

torch = pytest.importorskip("torch", reason="tinn.torch needs torch (pip install -e '.[test]' installs it)")

import tinn  # noqa: E402
import tinn.torch as tt  # noqa: E402
from tinn.torch import _tensors  # noqa: E402
from tinn.torch._tensors import DIRECT, HOST, UPLOAD  # noqa: E402
from conftest import on_path, sample  # noqa: E402
from test_device_path import _Seam  # noqa: E402
from test_torch import HASH, SMOOTH_NET  # noqa: E402

host_path_exists = pytest.mark.x64_only("the host path to compare with runs only on the CPU")
K = 3


def test_the_rule_names_the_device_taichi_reads():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert _tensors.rule(ti.x64, False, False) == (HOST, cpu)
    assert _tensors.rule(ti.arm64, False, False) == (HOST, cpu)
    assert _tensors.rule(ti.x64, True, False) == (DIRECT, cpu)
    assert _tensors.rule(ti.arm64, True, True) == (DIRECT, cpu)
    assert _tensors.rule(ti.cuda, True, True) == (DIRECT, cuda)
    assert _tensors.rule(ti.cuda, True, False) == (UPLOAD, cpu)          # a torch without CUDA
    for arch in (ti.vulkan, ti.metal, ti.opengl):
        assert _tensors.rule(arch, True, False) == (UPLOAD, cpu)
        assert _tensors.rule(arch, True, True) == (UPLOAD, cpu)
    arch, torch_cuda = impl.current_cfg().arch, torch.cuda.is_available()
    direct = arch in (ti.x64, ti.arm64) or (arch == ti.cuda and torch_cuda)
    with on_path(True):
        assert _tensors.route()[0] == (DIRECT if direct else UPLOAD)
    with on_path(False):
        assert _tensors.route()[0] == (HOST if arch in (ti.x64, ti.arm64) else DIRECT if direct else UPLOAD)


def build(routed: bool):
    """A HashGrid + MLP model, or a routed array of ``K`` of them."""
    return tt.NetworkWithInputEncoding(3, 2, HASH, SMOOTH_NET, seed=5, n_instances=K if routed else 1)


def batch(rng, routed: bool, n=200):
    """``(x, ids, w)``: inputs ``(n, 3)``, routing ids ``(n,)`` (or ``None``), output weights ``(n, 2)``."""
    x = torch.from_numpy(rng.random((n, 3), dtype=np.float32))
    ids = torch.from_numpy(rng.integers(0, K, n)) if routed else None
    return x, ids, torch.from_numpy(rng.standard_normal((n, 2), dtype=np.float32))


def first_and_second_order(model, x, ids, w):
    """Outputs, and ``x.grad`` / ``params.grad`` of ``L = sum(w * y)``, and of the Eikonal loss
    ``mean((|dL/dx| - 1)^2)`` through ``backward_backward_input``."""
    out = {}
    x1 = x.clone().requires_grad_(True)
    y = model(x1, instance=ids)
    model.zero_grad()
    (w * y).sum().backward()
    out.update(y=y.detach(), dx=x1.grad, dparams=model.params.grad.clone())
    with torch.no_grad():
        out["inference"] = model(x, instance=ids)
    x2 = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad((w * model(x2, instance=ids)).sum(), x2, create_graph=True)
    model.zero_grad()
    (g.norm(dim=1) - 1).square().mean().backward()
    out.update(eikonal_dx=x2.grad, eikonal_dparams=model.params.grad.clone())
    return out


class _Arrays:
    """Records the kinds of arrays a native object's calls take and return."""

    def __init__(self, monkeypatch, native):
        self.kinds = set()
        for name in ("forward", "inference", "backward", "backward_backward_input"):
            monkeypatch.setattr(native, name, self._wrap(getattr(native, name)))

    def _wrap(self, real):
        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            for a in list(args) + list(kwargs.values()) + list(result if isinstance(result, tuple) else [result]):
                if isinstance(a, (np.ndarray, ti.Ndarray)):
                    self.kinds.add("ti.ndarray" if isinstance(a, ti.Ndarray) else "numpy")
            return result
        return call


@host_path_exists
@pytest.mark.parametrize("routed", sample([pytest.param(False, id="model"), pytest.param(True, id="routed array")],
                                            keep=[False]))    # a routed array's own grid kinds: the full suite
def test_the_device_path_gives_the_host_paths_results(rng, monkeypatch, routed):
    x, ids, w = batch(rng, routed)
    with on_path(False):
        host = first_and_second_order(build(routed), x, ids, w)
    with on_path(True):
        model = build(routed)
        arrays = _Arrays(monkeypatch, model.native_tcnn_module)
        device = first_and_second_order(model, x, ids, w)
    assert arrays.kinds == {"ti.ndarray"}                       # every batch crossed as a ti.ndarray
    for name, want in host.items():
        got = device[name]
        assert got.dtype == torch.float32 and got.shape == want.shape, name
        scale = float(want.abs().max())
        assert scale > 0, name
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5 * scale, err_msg=name)


@host_path_exists
def test_a_dense_array_batch_on_the_device_path_gives_the_host_paths_results(rng):
    x = torch.from_numpy(rng.random((K, 40, 3), dtype=np.float32)).requires_grad_(True)
    results = []
    for device in (False, True):
        with on_path(device):
            model = build(routed=True)
            y = model(x)
            x.grad = None
            y.square().sum().backward()
            results.append((y.detach(), x.grad, model.params.grad))
    for got, want in zip(results[1], results[0]):
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("routed, device", sample([(False, False), (True, False), (False, True), (True, True)],
                                                  keep=[1, 2]),
                         ids=["model-default path", "routed array-default path", "model-device path",
                              "routed array-device path"])
def test_the_bridge_equals_the_native_api(rng, routed, device):
    """On every arch and route: the module's outputs and gradients are those of a native object built with
    the same seed and fed numpy arrays; outputs follow the input's dtype."""
    x, ids, w = batch(rng, routed)
    with on_path(device):
        model = build(routed)
        native = tinn.NetworkWithInputEncoding(3, 2, HASH, SMOOTH_NET, seed=5, n_instances=model.n_instances)
        inst = None if ids is None else ids.numpy().astype(np.int32)
        y_native, ctx = native.forward(x.numpy(), inst)
        dx_native = native.backward(ctx, w.numpy())
        x1 = x.clone().requires_grad_(True)
        y = model(x1, instance=ids)
        (w * y).sum().backward()
        with torch.no_grad():
            y64 = model(x.double(), instance=ids)
    assert y64.dtype == torch.float64 and y.dtype == torch.float32
    # numpy batches take the host's kernels and tensors the device's (on CUDA: fused kernels, sums in another order)
    rtol = 1e-6 if impl.current_cfg().arch != ti.cuda else 1e-5
    np.testing.assert_allclose(y.detach().cpu().numpy(), y_native, rtol=rtol, atol=1e-6)
    np.testing.assert_allclose(y64.cpu().numpy(), y_native, rtol=rtol, atol=1e-6)
    np.testing.assert_allclose(x1.grad.cpu().numpy(), dx_native, rtol=10 * rtol, atol=1e-6 * np.abs(dx_native).max())
    g = native.gradients()
    np.testing.assert_allclose(model.params.grad.cpu().numpy(), g, rtol=10 * rtol, atol=1e-6 * np.abs(g).max())


class _HostSeam(_Seam):
    """:class:`test_device_path._Seam`, and every tensor converted to or from numpy or copied to the CPU."""

    def __init__(self, monkeypatch, batch):
        super().__init__(monkeypatch, batch)
        self.tensors = []
        for owner, name in ((torch.Tensor, "numpy"), (torch.Tensor, "cpu"), (torch, "from_numpy")):
            monkeypatch.setattr(owner, name, self._record(getattr(owner, name), name))

    def _record(self, real, name):
        def wrapped(*a, **k):
            self.tensors.append(name)
            return real(*a, **k)
        return wrapped


@pytest.mark.x64_only("the device path is forced on the CPU, whose tensors Taichi's kernels address")
@pytest.mark.parametrize("routed, eikonal", sample([(False, False), (True, False), (False, True), (True, True)],
                                                   keep=[2]))
def test_a_torch_training_step_on_the_device_path_stays_there(rng, monkeypatch, device_path, routed, eikonal):
    """Forward, loss (with ``eikonal``: plus an Eikonal term through ``backward_backward_input``), backward
    and a ``torch.optim.Adam`` step of a HashGrid + MLP model or a routed array of them: no tensor passes
    through numpy or the host, no ndarray is read back, no host BLAS; only the loss (and for the array the
    per-network sample counts) comes back."""
    B = 1 << 14
    model = build(routed=routed)
    assert model.n_params < B
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.from_numpy(rng.random((B, 3), dtype=np.float32)).requires_grad_(eikonal)
    target = torch.from_numpy(rng.random((B, 2), dtype=np.float32))
    ids = torch.from_numpy(rng.integers(0, K, B).astype(np.int32)) if routed else None

    def step():
        y = model(x, instance=ids) if routed else model(x)
        loss = (y - target).square().mean()
        if eikonal:
            dx, = torch.autograd.grad(y[:, 0].sum(), x, create_graph=True)
            loss = loss + 1e-3 * (dx.norm(dim=1) - 1).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    first = step()                                          # compiles outside the instrumented steps
    before = model.params.detach().clone()
    seam = _HostSeam(monkeypatch, B)
    losses = [step() for _ in range(3)]
    assert seam.tensors == [] and seam.products == [] and seam.downloads == [] and seam.host_arguments == []
    assert losses[-1] < first and not torch.equal(model.params.detach(), before)
