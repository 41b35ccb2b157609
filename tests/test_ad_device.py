"""tinn.ad stages on the device path (``tinn.runtime.program.FORCE``): the batch stays on the device.

A stage step (the Tape's forward and reverse through a stage, then the optimizer) moves only the survey's
four counters between host and device, whatever the batch size; each stage call launches a fixed set of
copy kernels; the optimizer gets the networks the stage reached as a device mask.
"""
import numpy as np
import pytest
import taichi as ti

import tinn
from conftest import SMOOTH_ENCODING, sample
from tinn.runtime import probe as _probe

NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "Softplus",
       "output_activation": "None"}
ENCODING = SMOOTH_ENCODING
K = 4
SURVEY = 4
"""Counters a stage call reads back: elements taken, the ids' least and greatest, the first non-finite element."""
FORWARD_COPIES = {"_survey": 1, "ndarray_to_ext_arr": 1, "_gather": 1}
"""A stage call's own launches before the network runs: the survey, its read-back, the gather into the batch."""


@pytest.fixture(autouse=True)
def _on_the_device_path(device_path):
    """Every test here runs on the device path (conftest's ``device_path``)."""


class Program:
    """``x`` (R, S) random points routed to K networks (network K-1 never), a third masked out; the loss is
    ``Σ w_I · out[I]`` over the stage's output (``y``, or the gradient ``g`` of a gradient stage)."""

    def __init__(self, R, S, gradient, rng):
        self.net = tinn.NetworkWithInputEncoding(2, 1, ENCODING, NET, n_instances=K)
        self.trainer = tinn.Trainer(self.net, tinn.create_optimizer({"otype": "Adam", "learning_rate": 1e-2}),
                                    tinn.create_loss({"otype": "L2"}))
        n_out = 2 if gradient else 1
        self.x = ti.Vector.field(2, ti.f32, (R, S), needs_grad=True)
        self.out = ti.Vector.field(n_out, ti.f32, (R, S), needs_grad=True)
        self.instance, self.mask = ti.field(ti.i32, (R, S)), ti.field(ti.i32, (R, S))
        self.w = ti.Vector.field(n_out, ti.f32, (R, S))
        self.loss = ti.field(ti.f32, (), needs_grad=True)
        self.x.from_numpy(rng.random((R, S, 2), dtype=np.float32))
        self.instance.from_numpy(rng.integers(0, K - 1, (R, S)).astype(np.int32))
        self.mask.from_numpy((rng.random((R, S)) > 0.3).astype(np.int32))
        self.w.from_numpy(rng.normal(size=(R, S, n_out)).astype(np.float32))
        make = tinn.ad.gradient_stage if gradient else tinn.ad.stage
        self.stage = make(self.net, self.x, self.out, instance=self.instance, mask=self.mask)
        out, w, loss = self.out, self.w, self.loss

        @ti.kernel
        def total():
            for I in ti.grouped(out):
                loss[None] += w[I].dot(out[I])

        self.total = total

    def step(self):
        self.net.zero_grad()
        with ti.ad.Tape(loss=self.loss):
            self.stage()
            self.total()
        self.trainer.optimizer_step(active=self.stage.active)


def counted_step(R, S, gradient):
    prog = Program(R, S, gradient, np.random.default_rng(0))
    prog.step()                                       # compiles
    with _probe.counting() as call:
        prog.stage()
    with _probe.counting() as step:
        prog.step()
    return prog, call, step


@pytest.mark.parametrize("gradient", sample([pytest.param(False, id="stage"), pytest.param(True, id="gradient_stage")],
                                              keep=[True]))
def test_a_stage_step_moves_the_survey_counters_only_whatever_the_batch(gradient):
    small, large = counted_step(16, 32, gradient), counted_step(64, 128, gradient)
    for _, call, step in (small, large):
        assert call.moved == SURVEY and call.read_backs == 1
        assert step.moved == SURVEY and step.read_backs == 1
        assert step.numpy_arguments == []
        for name, count in FORWARD_COPIES.items():
            assert call.kernels[name] == count
        assert step.kernels["_take_gradient"] == 1 and step.kernels["_add_gradient"] == 1
    assert small[1].kernels == large[1].kernels          # the launches of a call do not grow with the batch
    tape_clears = ("clear_gradients", "fill_field")      # ti.ad.Tape zeroes every field's .grad: not the stage's
    assert {k: v for k, v in small[2].kernels.items() if k not in tape_clears} == \
           {k: v for k, v in large[2].kernels.items() if k not in tape_clears}


def test_the_optimizer_steps_the_networks_the_stage_reached_from_a_device_mask():
    prog = Program(16, 32, False, np.random.default_rng(1))
    before = prog.net.params()
    prog.step()
    active = prog.stage.active
    assert isinstance(active, ti.Ndarray)
    np.testing.assert_array_equal(active.to_numpy(), [1, 1, 1, 0])
    after = prog.net.params()
    assert np.all(np.any(after[:K - 1] != before[:K - 1], axis=1))
    np.testing.assert_array_equal(after[K - 1], before[K - 1])


def test_a_non_finite_input_or_a_bad_id_raises_before_the_network_runs():
    prog = Program(8, 8, False, np.random.default_rng(2))
    prog.mask.fill(1)
    prog.out.fill(7.0)
    prog.x[3, 5] = [np.nan, 0.0]
    with pytest.raises(ValueError, match=r"x must be finite: element \(3, 5\)"):
        prog.stage()
    prog.x[3, 5] = [0.5, 0.5]
    prog.instance[2, 2] = K
    with pytest.raises(ValueError, match=r"instance ids must lie in \[0, 4\)"):
        prog.stage()
    assert np.all(prog.out.to_numpy() == 7.0)


@pytest.mark.parametrize("gradient", sample([pytest.param(False, id="stage"), pytest.param(True, id="gradient_stage")],
                                              keep=[False]))
def test_a_stage_over_many_scan_blocks_equals_the_batch_api(gradient):
    """64 x 128 elements (32 blocks of the survey's prefix sum), a third masked out: the stage's output is the
    batch API's on the taken elements (``inference``, or ``J^T 1`` by ``backward`` with ``dL/dy = 1``), 0 for
    the others; the reverse pass gives ``x.grad`` and the networks' gradients of ``Σ w·out``."""
    prog = Program(64, 128, gradient, np.random.default_rng(3))
    prog.net.zero_grad()
    with ti.ad.Tape(loss=prog.loss):
        prog.stage()
        prog.total()
    x, inst = prog.x.to_numpy().reshape(-1, 2), prog.instance.to_numpy().reshape(-1)
    taken = prog.mask.to_numpy().reshape(-1) != 0
    out = prog.out.to_numpy().reshape(len(x), -1)
    xt, it = np.ascontiguousarray(x[taken]), np.ascontiguousarray(inst[taken])
    if gradient:
        _, ctx = prog.net.forward(xt, it)
        expected = prog.net.backward(ctx, np.ones((len(xt), 1), np.float32), input_gradient=True, mode="overwrite")
    else:
        expected = prog.net.inference(xt, it)
    expected = np.asarray(expected.to_numpy() if hasattr(expected, "to_numpy") else expected)
    np.testing.assert_allclose(out[taken], expected, rtol=1e-4, atol=1e-6)
    assert (out[~taken] == 0).all()
