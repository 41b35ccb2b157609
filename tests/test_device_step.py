"""A training step of device batches never waits: it reads nothing back, launches few kernels, checks its batch on
the device, skips the update of a bad batch there and raises its ``ValueError`` when the loss is read or at the
trainer's next call that reads from the device (DESIGN: "Non-finite device batches skip the update on the device").

On the CPU the device path is forced (``tinn.runtime.program.FORCE``); there the MLP runs layer by layer, so a step of
``config_hash``'s model may launch at most 16 kernels (a routed array's 24), and none of them reads back. The
models here have config_hash's components and keys with a smaller grid (``conftest.small_config_hash``): what runs,
and so the launches, depend on the components, not on the tables' sizes.

An inference of device batches never waits either: the census, the encoding and the MLP (one fused kernel, or a
kernel per layer), nothing read back; a bad batch is reported by the object's next call that reads.
"""
import numpy as np
import pytest
import taichi as ti

import tinn
from tinn.batch import buffers as _buffers
from tinn.runtime import program as _program
from tinn.batch.loss_value import LossValue
from tinn.runtime.probe import counting
from tinn.networks import _kernel_mlp
from test_device_path import use_mlp_kernels
from conftest import on_path, sample, small_config_hash


SINGLE_LAUNCHES, ARRAY_LAUNCHES = 16, 24
"""Issue's bounds for the CPU-forced device path: a single network's step, a routed array's step."""
SECOND_ORDER_LAUNCHES = 40
"""A backward_backward_input call of config_hash's model on the CPU-forced device path (its count when written)."""


def batch(rng, B, n_in, n_out, K=None):
    x, t = _buffers.put(rng.random((B, n_in), dtype=np.float32)), _buffers.put(rng.random((B, n_out), dtype=np.float32))
    ids = None if K is None else _buffers.put(rng.integers(0, K, B).astype(np.int32), ti.i32)
    return x, t, ids


@pytest.mark.parametrize("K", [None, 16])
def test_a_device_step_reads_nothing_back_and_launches_few_kernels(rng, device_path, K):
    model = tinn.create_from_config(2, 3, small_config_hash(), n_instances=K or 1)
    x, t, ids = batch(rng, 256, 2, 3, K)
    for _ in range(2):                                            # compiles outside the counted step
        float(model.trainer.training_step(x, t, ids))
    with counting() as seen:
        loss = model.trainer.training_step(x, t, ids)
    assert seen.read_backs == 0 and seen.uploads == 0 and seen.numpy_arguments == []
    assert seen.launches <= (SINGLE_LAUNCHES if K is None else ARRAY_LAUNCHES), seen.kernels
    assert isinstance(loss, LossValue) and np.isfinite(float(loss))


def test_a_device_second_order_call_keeps_its_launch_count(rng, device_path):
    model = tinn.create_from_config(2, 3, small_config_hash())
    x, _, _ = batch(rng, 256, 2, 3)
    dy, v = _buffers.put(rng.random((256, 3), dtype=np.float32)), _buffers.put(rng.random((256, 2), dtype=np.float32))
    for _ in range(2):
        _, ctx = model.network.forward(x)
        model.network.backward_backward_input(ctx, v, dy)
    _, ctx = model.network.forward(x)
    with counting() as seen:
        model.network.backward_backward_input(ctx, v, dy)
    assert seen.read_backs == 0 and seen.numpy_arguments == []
    assert seen.launches <= SECOND_ORDER_LAUNCHES, seen.kernels


def test_a_device_loss_behaves_as_the_loss(rng, device_path):
    """Read lazily, the loss equals the host path's and works as a float."""
    model = tinn.create_from_config(2, 3, small_config_hash())
    host_x, host_t = rng.random((512, 2), dtype=np.float32), rng.random((512, 3), dtype=np.float32)
    with on_path(False):
        reference = tinn.create_from_config(2, 3, small_config_hash())
        expected = reference.trainer.forward(host_x, host_t).loss
    loss = model.trainer.forward(_buffers.put(host_x), _buffers.put(host_t)).loss
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert loss == pytest.approx(expected, rel=1e-5) and loss > 0 and 2 * loss > loss and -loss < 0
    assert f"{loss:.3e}" == f"{float(loss):.3e}" and abs(loss - float(loss)) == 0
    assert float(np.asarray(loss)) == float(loss)


def _bad(rng, what, B, K):
    x, t = rng.random((B, 2), dtype=np.float32), rng.random((B, 3), dtype=np.float32)
    pdf = rng.random((B, 3), dtype=np.float32) + 0.5
    ids = rng.integers(0, K, B).astype(np.int32)
    if what == "x":
        x[5, 1] = np.nan
    elif what == "target":
        t[7, 0] = np.inf
    elif what == "pdf":
        pdf[3, 2] = 0.0
    elif what == "instance":
        ids[9] = K
    return x, t, pdf, ids


@pytest.mark.parametrize("K", sample([1, 4], keep=[4]))
@pytest.mark.parametrize("what, message", [("x", "x must be finite: row 5 holds nan"),
                                           ("target", "target must be finite: row 7 holds inf"),
                                           ("pdf", r"pdf must be finite and > 0: row 3 holds 0\.0"),
                                           ("instance", r"instance ids must lie in \[0, 4\)")])
def test_a_bad_device_batch_skips_its_update_and_raises_when_read(rng, device_path, K, what, message):
    if what == "instance" and K == 1:
        pytest.skip("a single network takes no ids")
    config = dict(small_config_hash(), optimizer={"otype": "EMA", "nested": {"otype": "Adam", "learning_rate": 1e-2}})
    model = tinn.create_from_config(2, 3, config, n_instances=K)
    trainer = model.trainer
    put = _buffers.put
    good = _bad(rng, None, 256, K)

    def step(x, t, pdf, ids):
        return trainer.training_step(put(x), put(t), put(ids, ti.i32) if K > 1 else None, put(pdf))

    float(step(*good))
    params, state = model.network.params().copy(), {k: v.copy() for k, v in trainer.optimizer.state_dict().items()}
    inference = trainer.params_inference().copy()
    with counting() as seen:
        loss = step(*_bad(rng, what, 256, K))                      # returns: nothing is read back
    assert seen.read_backs == 0
    np.testing.assert_array_equal(model.network.params(), params)         # the model's own read does not settle
    for key, value in trainer.optimizer.state_dict().items():
        np.testing.assert_array_equal(value, state[key], err_msg=key)
    with pytest.raises(ValueError, match=message):
        float(loss)
    with pytest.raises(ValueError, match=message):                # the step's loss stays bad
        loss > 0
    trainer.params()                                              # reported once: the trainer goes on
    np.testing.assert_array_equal(trainer.params_inference(), inference)
    assert float(step(*good)) > 0
    assert not np.array_equal(model.network.params(), params)


@pytest.mark.parametrize("what, message", [("target", r"target must be finite: row \(2, 5\) holds inf"),
                                           ("pdf", r"pdf must be finite and > 0: row \(2, 5\) holds -1\.0")])
def test_a_bad_dense_device_batch_names_network_and_sample(rng, device_path, what, message):
    """A dense ``(K, B_k, D)`` step's census checks its ``target`` and ``pdf`` in their own layout and names a bad
    value of network k's sample b as the host path does, ``row (k, b)`` (not its row of the flattened batch,
    2 x 16 + 5); the step updates nothing."""
    K, B = 4, 16
    model = tinn.create_from_config(2, 3, small_config_hash(), n_instances=K)
    x, t = rng.random((K, B, 2), dtype=np.float32), rng.random((K, B, 3), dtype=np.float32)
    pdf = rng.random((K, B, 3), dtype=np.float32) + 0.5
    {"target": t, "pdf": pdf}[what][2, 5, 1] = np.inf if what == "target" else -1.0
    params = model.network.params().copy()
    loss = model.trainer.training_step(_buffers.put(x), _buffers.put(t), pdf=_buffers.put(pdf))
    with pytest.raises(ValueError, match=message):
        float(loss)
    np.testing.assert_array_equal(model.network.params(), params)
    with on_path(False), pytest.raises(ValueError, match=message):                       # the host batch's check says the same
        float(model.trainer.training_step(x, t, pdf=pdf))


def test_a_bad_device_step_raises_at_the_trainers_next_read(rng, device_path):
    """Unread, a bad step's error comes from the next call that reads from the device: a later step's loss, or
    ``params()``; the steps between them update as usual."""
    model = tinn.create_from_config(2, 3, small_config_hash())
    trainer, put = model.trainer, _buffers.put
    x, t, pdf, _ = _bad(rng, "x", 128, 1)
    trainer.training_step(put(x), put(t))
    good = trainer.training_step(put(t[:, :2].copy()), put(t))
    with pytest.raises(ValueError, match=r"x must be finite: row 5 holds nan \(in training step 1 "):
        float(good)
    assert float(good) > 0                                        # reported once; the good step's loss reads
    trainer.training_step(put(x), put(t))
    with pytest.raises(ValueError, match="x must be finite"):
        trainer.params()
    trainer.params()


@pytest.mark.parametrize("K", [1, 3])
def test_inference_writes_into_the_callers_buffer(rng, device_path, K):
    """``inference(x, out=...)``: the outputs land in the caller's buffer (equal to a plain call); on the device
    the network's last kernel writes there (no copy kernel); dense arrays and host arrays too."""
    model = tinn.create_from_config(2, 3, small_config_hash(), n_instances=K).network
    x = rng.random((K, 100, 2) if K > 1 else (300, 2), dtype=np.float32)
    xd = _buffers.put(x)
    expected = model.inference(xd).to_numpy()
    out = _buffers.buffer(expected.shape)
    with counting() as seen:
        assert model.inference(xd, out=out) is out
    np.testing.assert_array_equal(out.to_numpy(), expected)
    if K == 1:
        assert "_columns" not in seen.kernels
        if not _kernel_mlp.takes_fused(model.network.plan):     # (GPU archs run the MLP as one fused kernel)
            assert seen.kernels["_layer_forward"] == 3
    host = np.full(expected.shape, np.nan, np.float32)
    with on_path(False):
        assert model.inference(x, out=host) is host
        np.testing.assert_allclose(host, expected, rtol=1e-4, atol=1e-6)


def test_inference_refuses_a_wrong_output_buffer(rng, device_path):
    model = tinn.create_from_config(2, 3, small_config_hash()).network
    x = _buffers.put(rng.random((64, 2), dtype=np.float32))
    for out, error in [(np.empty((64, 3), np.float32), TypeError), (_buffers.buffer((64, 2)), ValueError),
                       (_buffers.buffer((64, 3), ti.i32), TypeError)]:
        with pytest.raises(error, match="out must"):
            model.inference(x, out=out)


# -- inference: no read-back; the census and the fused MLP, which runs the grid inside its launch ----------------------
ROUTINGS = ("single", "routed", "numpy ids", "dense")
FORBIDDEN = ("_count_bad", "_id_census", "_sort_ids", "_tile_table", "_regroup")
"""The kernels an inference used to launch and needs no more: a count of non-finite values (read back), a
census of the ids (read back), the host-planned tile sort, a copy of a dense batch's outputs into its layout."""


def inference_batch(rng, routing, K, B=256):
    """``(x, instance)`` of a routing kind: ``x`` a ti.ndarray ``(B, 2)`` (dense: ``(K, B // K, 2)``), the ids a
    ti.ndarray, numpy ids, or none."""
    if routing == "dense":
        return _buffers.put(rng.random((K, B // K, 2), dtype=np.float32)), None
    x = _buffers.put(rng.random((B, 2), dtype=np.float32))
    ids = rng.integers(0, K, B).astype(np.int32)
    return x, {"single": None, "routed": _buffers.put(ids, ti.i32), "numpy ids": ids}[routing]


def inference_launches(model, routing) -> int:
    """The bound: the census and one fused kernel for the grid and the MLP; on the per-layer kernels the census, the
    encoding's forward, a kernel per layer and a dense batch's copy into its layout; plus the upload of numpy ids."""
    plan = model.network.plan
    if _kernel_mlp.takes_fused(plan):
        return 2 + (routing == "numpy ids")
    return 2 + len(plan.layers) + (routing == "dense") + (routing == "numpy ids")


@pytest.mark.parametrize("mlp_kernels", ["kernels", "fused"])
@pytest.mark.parametrize("routing", ROUTINGS)
def test_a_device_inference_reads_nothing_back_and_launches_few_kernels(rng, monkeypatch, device_path, routing,
                                                                        mlp_kernels):
    """An inference of device batches launches the census (which flattens a dense batch) and the fused MLP, whose
    tiles encode their samples through the grid in shared memory and write the outputs in the caller's layout:
    two launches, single network, routed or dense; on the per-layer kernels, the census, the encoding and a
    kernel per layer. It reads nothing back and gives the host path's outputs."""
    use_mlp_kernels(monkeypatch, mlp_kernels)
    K = 1 if routing == "single" else 16
    model = tinn.create_from_config(2, 3, small_config_hash(), n_instances=K).network
    x, ids = inference_batch(rng, routing, K)
    for _ in range(2):                                            # compiles outside the counted call
        model.inference(x, ids)
    with counting() as seen:
        y = model.inference(x, ids)
    assert seen.read_backs == 0 and seen.numpy_arguments == []
    forbidden = FORBIDDEN if mlp_kernels == "fused" else FORBIDDEN[:-1]
    assert not set(forbidden) & set(seen.kernels), seen.kernels
    assert seen.launches <= inference_launches(model, routing), seen.kernels
    if mlp_kernels == "fused":
        assert seen.launches <= 2 + (routing == "numpy ids"), seen.kernels
    host_x, host_ids = x.to_numpy(), ids.to_numpy() if isinstance(ids, ti.Ndarray) else ids
    with on_path(False):
        expected = model.inference(host_x, host_ids)
    np.testing.assert_allclose(y.to_numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("routing, what, message", [
    ("single", "x", r"x must be finite: row 5 holds nan"),
    ("routed", "x", r"x must be finite: row 5 holds nan"),
    ("dense", "x", r"x must be finite: row \(0, 5\) holds nan"),
    ("routed", "instance", r"instance ids must lie in \[0, 4\), got values in \[0, 4\]")])
def test_a_bad_device_inference_raises_at_the_next_call_that_reads(rng, device_path, routing, what, message):
    """A device batch holding NaN (or an id out of range) is found by the inference's census: the call returns
    without waiting, the other samples' outputs are right, and the ``ValueError`` (naming the call) comes at the
    model's next call that reads from the device (``params()``, an inference of a host batch, a trainer's reads),
    once."""
    K = 1 if routing == "single" else 4
    model = tinn.create_from_config(2, 3, small_config_hash(), n_instances=K)
    net = model.network
    x, ids = inference_batch(rng, routing, K)
    net.inference(x, ids)                                         # a good call first
    host_x = x.to_numpy().reshape(-1, 2)
    host_ids = np.repeat(np.arange(K), 256 // K).astype(np.int32) if routing == "dense" else \
        None if ids is None else ids.to_numpy()
    bad_x, bad_ids = host_x.copy(), None if host_ids is None else host_ids.copy()
    if what == "x":
        bad_x[5, 1] = np.nan
    else:
        bad_ids[9] = K
    shaped = bad_x.reshape(x.shape)
    with on_path(False):
        expected = net.inference(host_x, host_ids)               # off the CPU a device inference too: call 2
    bad_call = 2 if _program.is_cpu() else 3
    with counting() as seen:
        y = net.inference(_buffers.put(shaped), None if bad_ids is None or routing == "dense" else _buffers.put(bad_ids, ti.i32))
    assert seen.read_backs == 0
    good = np.ones(len(host_x), bool)
    good[5 if what == "x" else 9] = False
    np.testing.assert_allclose(y.to_numpy().reshape(-1, 3)[good], expected[good], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=message + rf" \(in inference call {bad_call} of this "
                                                   r"NetworkWithInputEncoding's device batches\)"):
        net.params()
    net.params()                                                  # reported once
    for read in (model.trainer.params, lambda: net.inference(host_x, host_ids)):     # other reads report it too
        net.inference(_buffers.put(shaped), None if bad_ids is None or routing == "dense" else _buffers.put(bad_ids, ti.i32))
        with pytest.raises(ValueError, match=message):
            read()
        read()


def test_inference_arguments_checkable_on_the_host_fail_before_any_kernel(rng, device_path):
    """Shapes, dtypes, a wrong ``out`` and numpy ids out of range: a ``ValueError`` / ``TypeError`` at once, no kernel."""
    net = tinn.create_from_config(2, 3, small_config_hash(), n_instances=4).network
    x, wide = _buffers.put(rng.random((64, 2), dtype=np.float32)), _buffers.put(np.zeros((64, 3), np.float32))
    short = _buffers.put(np.zeros(63, np.int32), ti.i32)
    calls = [(lambda: net.inference(x, np.full(64, 4, np.int32)), ValueError, r"instance ids must lie in \[0, 4\)"),
             (lambda: net.inference(x, np.zeros(64, np.int64)), TypeError, "instance must have dtype int32"),
             (lambda: net.inference(x, short), ValueError, "instance must have shape"),
             (lambda: net.inference(wide, np.zeros(64, np.int32)), ValueError, "x must have shape"),
             (lambda: net.inference(x), ValueError, "pass instance="),
             (lambda: net.inference(x, np.zeros(64, np.int32), out=_buffers.buffer((64, 2))), ValueError, "out must")]
    for call, error, message in calls:
        with counting() as seen:
            with pytest.raises(error, match=message):
                call()
        assert seen.launches == 0, (message, seen.kernels)
