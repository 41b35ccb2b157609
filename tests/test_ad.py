"""tinn.ad.stage under ti.ad.Tape: a user's differentiable program around a tinn model.

The program: kernel A moves sample points by a user parameter ``offset``; the stage evaluates the
network; kernel B composites ``tau_r = Σ_j scale · softplus(raw_rj) dt`` (one sample per parallel
iteration, the AD-safe form); kernel C takes pixel = 1 − exp(−tau) and the mean squared error.
"""
import functools
import types

import numpy as np
import pytest
import taichi as ti

import tinn
from compiles import compilations
from conftest import SMALL_GRID, SMOOTH_ENCODING, SMOOTH_NET, sample
from tinn.runtime import memory

R, S, DT = 24, 8, 0.05
NET = SMOOTH_NET
SMOOTH = SMOOTH_ENCODING


@pytest.fixture(autouse=True, params=sample(["host", "device"], keep=["host"]))
def path(request, set_path):
    """Every test runs on the CPU's own path and, in the full suite, on the device path too (kernels between the
    fields and tinn's batches, ``tinn.runtime.program.FORCE``; test_ad_device.py runs stages there by default)."""
    set_path(request.param == "device")
    return request.param


def active_ids(active):
    """A stage's ``active`` as network ids: host ids as they are, a device mask's ones."""
    return np.asarray(active) if isinstance(active, np.ndarray) else np.flatnonzero(active.to_numpy())


def np_softplus(v):
    return np.maximum(v, 0) + np.log1p(np.exp(-np.abs(v)))


@functools.cache
def _program_fields():
    """The program's fields and kernels, made once for the module (R rays of S samples): each ``Program`` sets
    their values, so its kernels (and Taichi's field helpers) compile once."""
    f = types.SimpleNamespace(
        o=ti.Vector.field(2, ti.f32, R), d=ti.Vector.field(2, ti.f32, R),
        offset=ti.Vector.field(2, ti.f32, (), needs_grad=True), scale=ti.field(ti.f32, (), needs_grad=True),
        pts=ti.Vector.field(2, ti.f32, (R, S), needs_grad=True),
        raw=ti.Vector.field(1, ti.f32, (R, S), needs_grad=True),
        tau=ti.field(ti.f32, R, needs_grad=True), pixel=ti.field(ti.f32, R, needs_grad=True),
        target=ti.field(ti.f32, R), loss=ti.field(ti.f32, (), needs_grad=True))
    o, d, offset, scale, pts, raw, tau, pixel, target, loss = (
        f.o, f.d, f.offset, f.scale, f.pts, f.raw, f.tau, f.pixel, f.target, f.loss)

    @ti.kernel
    def reset():                           # the Tape zeroes .grad fields, not the values accumulated into
        for r in tau:
            tau[r] = 0.0
            if r == 0:
                loss[None] = 0.0

    @ti.kernel
    def sample_points():
        for r, j in pts:
            pts[r, j] = o[r] + offset[None] + (j + 0.5) * DT * d[r]

    @ti.kernel
    def composite():
        for r, j in raw:
            v = raw[r, j][0]
            tau[r] += scale[None] * (ti.max(v, 0.0) + ti.log(1.0 + ti.exp(-ti.abs(v)))) * DT

    @ti.kernel
    def finish():
        for r in pixel:
            pixel[r] = 1.0 - ti.exp(-tau[r])
            loss[None] += (pixel[r] - target[r]) ** 2 / R

    f.kernels = reset, sample_points, composite, finish
    return f


class Program:
    """The user's program: fields and kernels, with the network as a tinn.ad stage (one program at a time: the
    fields are the module's)."""

    def __init__(self, network, rng, instance=None, mask=None):
        f = _program_fields()
        self.o, self.d, self.offset, self.scale, self.pts, self.raw = f.o, f.d, f.offset, f.scale, f.pts, f.raw
        self.tau, self.pixel, self.target, self.loss, self.kernels = f.tau, f.pixel, f.target, f.loss, f.kernels
        for field in (self.pts, self.raw, self.tau, self.pixel, self.loss):     # as new: a masked sample's raw is 0
            field.fill(0)
        self.o.from_numpy(rng.uniform(0.2, 0.4, (R, 2)).astype(np.float32))
        a = rng.uniform(0, 2 * np.pi, R)
        self.d.from_numpy(np.stack([np.cos(a), np.sin(a)], -1).astype(np.float32))
        self.target.from_numpy(rng.uniform(0.2, 0.6, R).astype(np.float32))
        self.scale[None] = 1.3
        self.offset[None] = [0.01, -0.02]
        self.network = network
        self.stage = tinn.ad.stage(network, self.pts, self.raw, instance=instance, mask=mask)

    def run(self):
        """The whole program (forward only outside a Tape); returns the loss."""
        reset, sample_points, composite, finish = self.kernels
        reset()
        sample_points()
        self.stage()
        composite()
        finish()
        return float(self.loss[None])

    def gradients(self):
        self.network.zero_grad()
        with ti.ad.Tape(loss=self.loss):
            self.run()
        return float(self.scale.grad[None]), self.offset.grad[None].to_numpy(), self.network.gradients()

    def batch_gradients(self, instance=None, mask=None):
        """The same loss's network gradients and Σ dL/dx through the batch API, in numpy."""
        P = self.pts.to_numpy().reshape(-1, 2)
        keep = np.ones(R * S, bool) if mask is None else mask.reshape(-1) != 0
        inst = None if instance is None else instance.reshape(-1)[keep]
        y, ctx = self.network.forward(P[keep], inst)
        raw = np.zeros(R * S)
        raw[keep] = y[:, 0]
        raw = raw.reshape(R, S)
        scale = float(self.scale[None])
        tau = (scale * np_softplus(raw) * DT).sum(1)        # masked samples: raw = 0
        pixel = 1 - np.exp(-tau)
        dL_draw = (2 * (pixel - self.target.to_numpy()) / R * (1 - pixel))[:, None] * scale / (1 + np.exp(-raw)) * DT
        dx = self.network.backward(ctx, dL_draw.reshape(-1, 1)[keep].astype(np.float32))
        return self.network.gradients(), dx.sum(0)


def finite_differences(prog, eps=1e-3):
    def at(scale, offset):
        prog.scale[None], prog.offset[None] = scale, offset
        return prog.run()

    s0, o0 = float(prog.scale[None]), prog.offset[None].to_numpy()
    d_scale = (at(s0 + eps, o0) - at(s0 - eps, o0)) / (2 * eps)
    d_offset = []
    for c in range(2):
        e = np.zeros(2, np.float32)
        e[c] = eps
        d_offset.append((at(s0, o0 + e) - at(s0, o0 - e)) / (2 * eps))
    at(s0, o0)
    return d_scale, np.array(d_offset)


def model(rng, n_instances=1):
    net = tinn.NetworkWithInputEncoding(2, 1, SMOOTH, NET, n_instances=n_instances)
    net.set_params(net.params() * 3 + rng.normal(0, 0.1, net.params().shape).astype(np.float32))
    return net


def test_stage_gradients_of_user_parameters_against_finite_differences(rng):
    prog = Program(model(rng), rng)
    d_scale, d_offset, _ = prog.gradients()
    fd_scale, fd_offset = finite_differences(prog)
    assert abs(fd_scale) > 1e-3 and np.abs(fd_offset).max() > 1e-3
    np.testing.assert_allclose(d_scale, fd_scale, rtol=1e-2)
    np.testing.assert_allclose(d_offset, fd_offset, rtol=2e-2, atol=2e-2 * np.abs(fd_offset).max())


def test_stage_network_gradients_equal_the_batch_api(rng):
    prog = Program(model(rng), rng)
    _, d_offset, grads = prog.gradients()
    batch_grads, dx_sum = prog.batch_gradients()
    np.testing.assert_allclose(grads, batch_grads, rtol=1e-4, atol=1e-5 * np.abs(batch_grads).max())
    np.testing.assert_allclose(d_offset, dx_sum, rtol=1e-4, atol=1e-6)


def test_stage_with_routing_and_a_mask(rng):
    """Each ray's samples go to network r % 3; a mask drops some samples (their raw is 0: softplus(0) each)."""
    inst_np = np.repeat((np.arange(R) % 3)[:, None], S, 1).astype(np.int32)
    mask_np = (rng.random((R, S)) > 0.3).astype(np.int32)
    instance, mask = ti.field(ti.i32, (R, S)), ti.field(ti.i32, (R, S))
    instance.from_numpy(inst_np)
    mask.from_numpy(mask_np)
    net = model(rng, n_instances=3)
    prog = Program(net, rng, instance, mask)
    d_scale, d_offset, grads = prog.gradients()
    assert np.all(prog.raw.to_numpy()[..., 0][mask_np == 0] == 0)
    np.testing.assert_array_equal(active_ids(prog.stage.active), [0, 1, 2])
    fd_scale, fd_offset = finite_differences(prog)
    np.testing.assert_allclose(d_scale, fd_scale, rtol=1e-2)
    np.testing.assert_allclose(d_offset, fd_offset, rtol=2e-2, atol=2e-2 * np.abs(fd_offset).max())
    # the network gradients: the masked samples' raw is a constant 0 in the composite
    batch_grads, dx_sum = prog.batch_gradients(inst_np, mask_np)
    np.testing.assert_allclose(grads, batch_grads, rtol=1e-4, atol=1e-5 * np.abs(batch_grads).max())
    np.testing.assert_allclose(d_offset, dx_sum, rtol=1e-4, atol=1e-6)


def test_stage_called_twice_on_the_same_fields(rng):
    """Two passes through the same fields in one Tape: each pass gets its own gradients (the stage consumes
    y.grad as Taichi's reverse of a store does)."""
    net = model(rng)
    n = 40
    base = ti.Vector.field(2, ti.f32, n)
    shift = ti.Vector.field(2, ti.f32, (), needs_grad=True)
    x = ti.Vector.field(2, ti.f32, n, needs_grad=True)
    y = ti.Vector.field(1, ti.f32, n, needs_grad=True)
    loss = ti.field(ti.f32, (), needs_grad=True)
    b = rng.uniform(0.2, 0.8, (n, 2)).astype(np.float32)
    base.from_numpy(b)
    shift[None] = [0.05, -0.03]
    stage = tinn.ad.stage(net, x, y)

    @ti.kernel
    def place(c: ti.f32):
        for i in x:
            x[i] = base[i] + c * shift[None]

    @ti.kernel
    def square(w: ti.f32):                  # linear in y: its reverse does not read y, which pass 2 overwrites
        for i in y:
            loss[None] += w * base[i][0] * y[i][0]

    net.zero_grad()
    with ti.ad.Tape(loss=loss):
        place(1.0)
        stage()
        square(1.0)
        place(-2.0)
        stage()
        square(0.5)
    grads, d_shift = net.gradients(), shift.grad[None].to_numpy()
    s = shift[None].to_numpy().astype(np.float32)
    _, ctx1 = net.forward((b + s).astype(np.float32))
    dx1 = net.backward(ctx1, b[:, :1].copy())
    _, ctx2 = net.forward((b - 2 * s).astype(np.float32))
    dx2 = net.backward(ctx2, 0.5 * b[:, :1], mode="accumulate")
    np.testing.assert_allclose(grads, net.gradients(), rtol=1e-4, atol=1e-5 * np.abs(grads).max())
    np.testing.assert_allclose(d_shift, dx1.sum(0) - 2 * dx2.sum(0), rtol=1e-4, atol=1e-5)


TAICHI_COPIES = {"matrix_to_ext_arr", "ext_arr_to_matrix"}
"""Taichi's kernels behind a Vector field's ``to_numpy`` / ``from_numpy``."""


@pytest.mark.parametrize("layout", ["soa", "blocked", "offset"])
def test_stage_on_fields_laid_out_otherwise(layout, path, rng):
    """Vector fields laid out SoA (their components apart: on x64 the CPU path reads and writes their memory, no
    copy kernel compiled), in blocks of a dense in a dense, and indexed from -5 (``offset=``; both read through
    Taichi's copies on the CPU path, and the device path's kernels index them from their offset): ``y`` is the batch
    forward of ``x``, and ``x.grad`` its input gradient under a loss linear in ``y``."""
    net, n = model(rng), 32
    if layout == "blocked":
        x, y = ti.Vector.field(2, ti.f32, needs_grad=True), ti.Vector.field(1, ti.f32, needs_grad=True)
        ti.root.dense(ti.i, 4).dense(ti.i, 8).place(x, x.grad, y, y.grad)
    else:
        keys = {"layout": ti.Layout.SOA} if layout == "soa" else {"offset": -5}
        x = ti.Vector.field(2, ti.f32, n, needs_grad=True, **keys)
        y = ti.Vector.field(1, ti.f32, n, needs_grad=True, **keys)
    w = ti.field(ti.f32, n, offset=-5 if layout == "offset" else None)
    loss = ti.field(ti.f32, (), needs_grad=True)
    xs = rng.uniform(0.1, 0.9, (n, 2)).astype(np.float32)
    ws = rng.normal(size=n).astype(np.float32)
    x.from_numpy(xs)
    w.from_numpy(ws)
    stage = tinn.ad.stage(net, x, y)

    @ti.kernel
    def weigh():
        for i in y:
            loss[None] += w[i] * y[i][0]

    with compilations() as compiled:
        with ti.ad.Tape(loss=loss):
            stage()
            weigh()
    expected, ctx = net.forward(xs)
    np.testing.assert_allclose(y.to_numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.to_numpy(), net.backward(ctx, ws[:, None]), rtol=1e-4, atol=1e-6)
    if path == "host" and memory.host_memory():
        assert bool(TAICHI_COPIES & set(compiled)) == (layout != "soa"), list(compiled)
    if layout == "offset":                              # an element is named by its own index
        x[-2] = [np.nan, 0.5]
        with pytest.raises(ValueError, match=r"x must be finite: element \(-2,\) holds \[nan"):
            stage()


def test_stage_checks_its_fields(rng):
    net = model(rng)
    x = ti.Vector.field(2, ti.f32, (4,), needs_grad=True)
    y = ti.Vector.field(1, ti.f32, (4,), needs_grad=True)
    with pytest.raises(ValueError, match="components"):
        tinn.ad.stage(net, ti.Vector.field(3, ti.f32, (4,)), y)
    with pytest.raises(ValueError, match="shape"):
        tinn.ad.stage(net, x, ti.Vector.field(1, ti.f32, (5,), needs_grad=True))
    with pytest.raises(ValueError, match="index offset of x"):
        tinn.ad.stage(net, x, y, mask=ti.field(ti.i32, (4,), offset=(2,)))
    with pytest.raises(ValueError, match="x is not placed"):
        tinn.ad.stage(net, ti.Vector.field(2, ti.f32), y)
    runtime = ti.lang.impl.get_runtime()                # (an unplaced field makes Taichi refuse every later kernel)
    runtime.global_vars[:] = [v for v in runtime.global_vars if v.ptr.snode() is not None]
    runtime.matrix_fields[:] = [f for f in runtime.matrix_fields if f.vars[0].ptr.snode() is not None]
    with pytest.raises(ValueError, match="needs_grad"):
        tinn.ad.stage(net, x, ti.Vector.field(1, ti.f32, (4,)))
    with pytest.raises(TypeError, match="int32"):
        tinn.ad.stage(net, x, y, mask=ti.field(ti.f32, (4,)))
    with pytest.raises(TypeError, match="tinn model"):
        tinn.ad.stage(object(), x, y)
    with pytest.raises(ValueError, match="instance"):
        tinn.ad.stage(model(rng, n_instances=2), x, y)


# ---- gradient_stage: an Eikonal loss mean_i (|∇ₓ f(x_i)| − 1)² through backward_backward_input ----
EIK_NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": "Softplus",
           "output_activation": "None"}
EIK_F = 2


def eikonal_reference(net, x, p):
    """float64 Eikonal loss of the model with parameters ``p`` at points ``x`` (tests/reference.py's MLP and
    Frequency formulas; ∇ₓ f by their first-order backward)."""
    from reference import frequency_grad_ref, frequency_ref, mlp_backward_ref, mlp_forward_ref, mlp_shapes, \
        mlp_unflatten, padded
    width = net.encoding.padded_output_width
    shapes = mlp_shapes(width, EIK_NET["n_neurons"], EIK_NET["n_hidden_layers"], 1)
    Ws = mlp_unflatten(p[:net.network.n_params], shapes)
    y, zs, hs = mlp_forward_ref(padded(frequency_ref(x, EIK_F), width, 1.0), Ws, "Softplus", "None")
    dy = np.zeros_like(y)
    dy[:, 0] = 1.0
    _, d_enc = mlp_backward_ref(Ws, zs, hs, dy, "Softplus", "None")
    g = frequency_grad_ref(x, d_enc[:, :2 * EIK_F * x.shape[1]], EIK_F)
    return np.mean((np.linalg.norm(g, axis=1) - 1) ** 2), g


class EikonalProgram:
    """x_i = base_i + shift (a user parameter); g = gradient_stage(x); loss = mean over the mask of (|g| − 1)²."""

    def __init__(self, net, base, instance=None, mask=None):
        n = len(base)
        self.base = ti.Vector.field(3, ti.f32, n)
        self.base.from_numpy(base)
        self.shift = ti.Vector.field(3, ti.f32, (), needs_grad=True)
        self.x = ti.Vector.field(3, ti.f32, n, needs_grad=True)
        self.g = ti.Vector.field(3, ti.f32, n, needs_grad=True)
        self.loss = ti.field(ti.f32, (), needs_grad=True)
        self.net, self.stage = net, tinn.ad.gradient_stage(net, self.x, self.g, instance=instance, mask=mask)
        weight = np.ones(n, np.float32) if mask is None else mask.to_numpy().astype(np.float32)
        self.weight = ti.field(ti.f32, n)
        self.weight.from_numpy(weight / weight.sum())
        b, s, x, g, w, loss = self.base, self.shift, self.x, self.g, self.weight, self.loss

        @ti.kernel
        def place():
            for i in x:
                x[i] = b[i] + s[None]

        @ti.kernel
        def eikonal():
            for i in g:
                loss[None] += w[i] * (g[i].norm() - 1.0) ** 2

        self.place, self.eikonal = place, eikonal

    def gradients(self):
        self.net.zero_grad()
        with ti.ad.Tape(loss=self.loss):
            self.place()
            self.stage()
            self.eikonal()
        return float(self.loss[None]), self.shift.grad[None].to_numpy(), self.net.gradients()


def eikonal_model(rng, n_instances=1):
    net = tinn.NetworkWithInputEncoding(3, 1, {"otype": "Frequency", "n_frequencies": EIK_F}, EIK_NET,
                                        n_instances=n_instances)
    net.set_params(net.params() * 2)
    return net


def test_gradient_stage_eikonal_gradients_against_finite_differences(rng):
    from reference import fd_gradient
    net = eikonal_model(rng)
    base = rng.uniform(0.1, 0.9, (32, 3)).astype(np.float32)
    prog = EikonalProgram(net, base)
    prog.shift[None] = [0.02, -0.01, 0.03]
    loss, d_shift, grads = prog.gradients()
    p = net.params().astype(np.float64)
    shift = prog.shift[None].to_numpy().astype(np.float64)
    ref_loss, ref_g = eikonal_reference(net, base + shift, p)
    np.testing.assert_allclose(prog.g.to_numpy(), ref_g, rtol=1e-4, atol=1e-4 * np.abs(ref_g).max())
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-4)
    fd_shift = fd_gradient(lambda s: eikonal_reference(net, base + s, p)[0], shift, 1e-6)
    np.testing.assert_allclose(d_shift, fd_shift, rtol=1e-3, atol=1e-3 * np.abs(fd_shift).max())
    picks = np.argsort(-np.abs(grads))[:6].tolist() + [0, net.network.n_params - 1]
    for i in picks:
        def at(v):
            q = p.copy()
            q[i] = v[0]
            return eikonal_reference(net, base + shift, q)[0]
        fd = fd_gradient(at, p[i:i + 1], 1e-6)[0]
        np.testing.assert_allclose(grads[i], fd, rtol=2e-3, atol=1e-3 * np.abs(grads).max(), err_msg=f"param {i}")


def test_gradient_stage_with_routing_and_a_mask_and_one_adam_step(rng):
    """Two networks, points routed alternately, a third of them masked: gradients equal the batch API's
    backward_backward_input on the kept points, and one Adam step lowers the Eikonal loss."""
    net = eikonal_model(rng, n_instances=2)
    trainer = tinn.Trainer(net, tinn.create_optimizer({"otype": "Adam", "learning_rate": 1e-3}),
                           tinn.create_loss({"otype": "L2"}))
    n = 30
    base = rng.uniform(0.1, 0.9, (n, 3)).astype(np.float32)
    instance, mask = ti.field(ti.i32, n), ti.field(ti.i32, n)
    inst_np, mask_np = (np.arange(n) % 2).astype(np.int32), (np.arange(n) % 3 != 0).astype(np.int32)
    instance.from_numpy(inst_np)
    mask.from_numpy(mask_np)
    prog = EikonalProgram(net, base, instance, mask)
    loss, _, grads = prog.gradients()
    g = prog.g.to_numpy()
    assert np.all(g[mask_np == 0] == 0)
    keep = mask_np != 0
    _, ctx = net.forward(base[keep], inst_np[keep])
    ones = np.ones((keep.sum(), 1), np.float32)
    dx = net.backward(ctx, ones)
    np.testing.assert_allclose(g[keep], dx, rtol=1e-4, atol=1e-5)
    norm = np.linalg.norm(dx, axis=1, keepdims=True)
    dL_dg = (2 * (norm - 1) / norm * dx / keep.sum()).astype(np.float32)
    net.backward_backward_input(ctx, dL_dg, ones)
    np.testing.assert_allclose(grads, net.gradients(), rtol=1e-4, atol=1e-5 * np.abs(grads).max())
    np.testing.assert_array_equal(active_ids(prog.stage.active), [0, 1])
    prog.gradients()
    trainer.optimizer_step()
    assert prog.gradients()[0] < loss


# ---- the gradient stage's forward: dL/dx alone, tcnn's GradientMode::Ignore ----
GRID = SMALL_GRID
INPUT_GRADIENT_CASES = {
    "grid and MLP, two networks": lambda: tinn.NetworkWithInputEncoding(2, 1, GRID, EIK_NET, n_instances=2),
    "composite with a grid": lambda: tinn.create_encoding(3, {"otype": "Composite", "nested": [
        dict(GRID, n_dims_to_encode=2), {"otype": "Frequency", "n_frequencies": 2}]}),
    "permutohedral": lambda: tinn.create_encoding(3, dict(GRID, otype="Permutohedral")),
    "MLP": lambda: tinn.create_network(3, 2, EIK_NET),
    "frequency (no parameters)": lambda: tinn.create_encoding(3, SMOOTH),
}


@pytest.mark.parametrize("make", sample([pytest.param(m, id=k) for k, m in INPUT_GRADIENT_CASES.items()],
                                         keep=[0, 1, 3, 4]))     # Permutohedral's own kernels: the full suite
def test_input_gradient_alone_is_the_backward_input_gradient_and_leaves_the_parameter_gradients(make, rng):
    """A component's ``_input_gradient(ctx, dL_dy)``: the ``dL/dx`` that ``backward`` returns (checked against
    finite differences in each component's tests), with every parameter gradient left as it was, bit for bit."""
    obj = make()
    n = 40
    x = rng.uniform(0.05, 0.95, (n, obj.n_input_dims)).astype(np.float32)
    ids = (np.arange(n) % obj.n_instances).astype(np.int32) if obj.n_instances > 1 else None
    dy = rng.normal(size=(n, obj.n_output_dims)).astype(np.float32)
    _, ctx = obj.forward(x, ids)
    dx = tinn.batch.batch.host(obj.backward(ctx, dy))
    before = obj.gradients()
    assert obj.n_params == 0 or np.abs(before).max() > 0           # (there is something to leave alone)
    alone = tinn.batch.batch.host(obj._input_gradient(ctx, ctx.batch.ops.adopt(dy)))
    np.testing.assert_array_equal(obj.gradients(), before)
    np.testing.assert_allclose(alone, dx, rtol=1e-6, atol=1e-7 * np.abs(dx).max())


def test_gradient_stage_of_a_grid_model_is_its_input_gradient_and_its_forward_touches_no_gradient(rng):
    net = tinn.NetworkWithInputEncoding(3, 1, GRID, EIK_NET)
    base = rng.uniform(0.1, 0.9, (50, 3)).astype(np.float32)
    prog = EikonalProgram(net, base)
    _, ctx = net.forward(base)
    dx = net.backward(ctx, np.ones((len(base), 1), np.float32))
    before = net.gradients()
    prog.place()                                   # x = base (no shift)
    prog.stage()                                   # outside a Tape: the forward alone
    np.testing.assert_allclose(prog.g.to_numpy(), dx, rtol=1e-6, atol=1e-7 * np.abs(dx).max())
    np.testing.assert_array_equal(net.gradients(), before)
