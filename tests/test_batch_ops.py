"""The batch operations of each kind (``tinn.batch.batch``): ``HOST`` (numpy) and ``DEVICE`` (``ti.ndarray``
kernels) have the same methods and give numpy's results; the kind is chosen by ``ops_of``; validation is
written once against them. Also: importing tinn changes no Taichi class, and reading a component's store
allocates nothing."""
import inspect

import numpy as np
import pytest
import taichi as ti
from taichi.lang._ndarray import Ndarray

import tinn
from tinn.batch.batch import DEVICE, HOST, as_batch, check_id_range, check_ids, ops_of
from tinn.batch.buffers import put
from tinn.registry import build_encoding

rng = np.random.default_rng(3)


def public_methods(ops) -> set:
    return {n for n, _ in inspect.getmembers(ops, callable) if not n.startswith("_")}


def test_both_kinds_have_the_same_operations():
    assert public_methods(HOST) == public_methods(DEVICE)
    assert {"empty_like", "full_like", "columns", "concatenate", "fold", "flatten", "unflatten", "has_bad",
            "host", "adopt", "copy_into"} <= public_methods(HOST)


@pytest.mark.parametrize("ops", [HOST, DEVICE], ids=["numpy", "ti.ndarray"])
def test_unused_arguments_are_kept_per_shape_and_dtype(ops):
    """A kernel's unread arguments (``unused``, ``no_ids``) are of the kind's type and made once, not per call:
    the host's belong to ``HOST`` (no module-global arrays)."""
    ints, floats = ops.unused((1,), np.int32), ops.unused((1, 1), np.float32)
    assert ints is ops.unused((1,), np.int32) and floats is ops.unused((1, 1), np.float32)
    assert ops_of(ints) is ops and tuple(ints.shape) == (1,) and tuple(floats.shape) == (1, 1)
    assert (ints.dtype, floats.dtype) == ((np.int32, np.float32) if ops is HOST else (ti.i32, ti.f32))
    assert ops.no_ids() is ops.no_ids() and ops.host(ops.no_ids()).tolist() == [0]


def test_ops_of_picks_the_device_for_any_ndarray():
    a = rng.random((4, 3), dtype=np.float32)
    assert ops_of(a) is HOST and ops_of(put(a)) is DEVICE and ops_of(a, put(a)) is DEVICE


@pytest.mark.parametrize("ops", [HOST, DEVICE], ids=["numpy", "ti.ndarray"])
def test_each_operation_matches_numpy(ops):
    a, b, c = (rng.normal(size=(5, 4)).astype(np.float32) for _ in range(3))
    kind = (lambda x: x) if ops is HOST else put
    A, B, C = kind(a), kind(b), kind(c)
    host = lambda x: np.asarray(ops.host(x))                                  # noqa: E731
    np.testing.assert_array_equal(host(ops.columns(A, 1, 2)), a[:, 1:3])
    np.testing.assert_array_equal(host(ops.concatenate([A, B])), np.hstack([a, b]))
    np.testing.assert_allclose(host(ops.fold([A, B, C], "+")), a + b + c, rtol=1e-6)
    np.testing.assert_allclose(host(ops.fold([A, B, C], "*")), a * b * c, rtol=1e-6)
    np.testing.assert_allclose(host(ops.add(A, B)), a + b, rtol=1e-6)
    np.testing.assert_allclose(host(ops.multiply(A, B)), a * b, rtol=1e-6)
    d = ops.full_like(A, 0.0, (5, 6))
    ops.add_to_columns(d, 2, B)
    want = np.zeros((5, 6), np.float32)
    want[:, 2:6] = b
    np.testing.assert_array_equal(host(d), want)
    dense = rng.normal(size=(3, 2, 4)).astype(np.float32)
    flat = ops.flatten(kind(dense))
    np.testing.assert_array_equal(host(flat), dense.reshape(6, 4))
    np.testing.assert_array_equal(host(ops.unflatten(flat, (3, 2))), dense)
    np.testing.assert_array_equal(host(ops.dense_ids(3, 2)), [0, 0, 1, 1, 2, 2])
    target = kind(np.zeros((5, 6), np.float32))
    assert ops.copy_into(target, kind(want)) is target
    np.testing.assert_array_equal(host(target), want)
    assert ops.empty_like(A, (2, 3)).shape == (2, 3) and host(ops.full(( 2, 2), 7.0)).tolist() == [[7, 7], [7, 7]]


@pytest.mark.parametrize("ops", [HOST, DEVICE], ids=["numpy", "ti.ndarray"])
@pytest.mark.parametrize("value, positive, bad", [(1.0, False, False), (np.nan, False, True), (-np.inf, False, True),
                                                  (0.0, True, True), (0.5, True, False)])
def test_has_bad_finds_non_finite_and_non_positive_values(ops, value, positive, bad):
    a = rng.random((6, 3), dtype=np.float32) + 0.1
    a[4, 2] = value
    assert ops.has_bad(a if ops is HOST else put(a), positive) is bad


@pytest.mark.parametrize("kind", ["numpy", "ti.ndarray"])
def test_validation_is_one_rule_for_both_kinds(kind, device_path):
    """The same messages for a numpy batch and, on the device path, a ti.ndarray one."""
    wrap = (lambda x: x) if kind == "numpy" else put
    x = rng.random((8, 3), dtype=np.float32)
    x[5, 1] = np.inf
    with pytest.raises(ValueError, match=r"x must be finite: row 5 holds inf"):
        as_batch(wrap(x), 3, finite=True)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, 2\), got \(8, 3\)"):
        as_batch(wrap(x), 2)
    with pytest.raises(TypeError, match="x must have dtype float32, got int32"):
        as_batch(wrap(np.zeros((8, 3), np.int32)) if kind == "numpy" else put(np.zeros((8, 3), np.int32), ti.i32), 3)
    with pytest.raises(ValueError, match=r"instance must have shape \(8,\), got \(7,\)"):
        check_ids(wrap(np.zeros(7, np.int32)) if kind == "numpy" else put(np.zeros(7, np.int32), ti.i32), 8)


def test_the_id_range_rule():
    check_id_range(0, 3, 4)
    for lo, hi in ((-1, 2), (0, 4)):
        with pytest.raises(ValueError, match=rf"ids must lie in \[0, 4\), got values in \[{lo}, {hi}\]"):
            check_id_range(lo, hi, 4)


def test_importing_tinn_changes_no_taichi_class():
    assert Ndarray.__init__.__module__ == "taichi.lang._ndarray"
    assert Ndarray.__init__.__qualname__ == "Ndarray.__init__"


def test_reading_the_store_allocates_nothing():
    config = {"otype": "HashGrid", "n_levels": 2, "log2_hashmap_size": 8}
    built = build_encoding(2, config)
    with pytest.raises(RuntimeError, match="no parameter memory"):
        built.store
    with pytest.raises(RuntimeError, match="no parameter memory"):
        built.inference(rng.random((4, 2), dtype=np.float32))
    made = tinn.create_encoding(2, config)
    assert made.store.n_params == made.n_params and made.params().shape == (made.n_params,)


@pytest.mark.parametrize("first", ["host path", "device path"])
def test_the_path_is_the_calls_not_the_models(first, set_path):
    """The kind of a call's batches picks the backends at every call (``routing.on_device``): a model used on one
    path gives the same results on the other, and back (nothing is chosen once per model)."""
    enc = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 6, "base_resolution": 4}
    net = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}
    x, dy = rng.random((37, 2), dtype=np.float32), rng.normal(size=(37, 3)).astype(np.float32)
    results = []
    for device in ([False, True, False] if first == "host path" else [True, False, True]):
        set_path(device)
        if not results:
            model = tinn.NetworkWithInputEncoding(2, 3, enc, net, seed=4)
        y, ctx = model.forward(x)
        dx = model.backward(ctx, dy)
        results.append((model.inference(x), y, dx, model.gradients()))
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("path", ["host", "device"])
@pytest.mark.parametrize("routing", ["single", "routed", "dense"])
def test_a_step_checks_each_argument_once(path, routing, monkeypatch, set_path):
    """A training step (and the trainer's ``forward``) checks the shape and dtype of ``x``, ``target``, ``pdf``
    and the ids once, at the step's entry, and the runtime once: the private methods it composes (the model's
    forward and backward, the loss, the optimizer's step) check none of them again, nor the model's output, and
    no public method of a component runs inside the step."""
    import tinn.batch.batch as batch
    set_path(path == "device")
    K = 1 if routing == "single" else 2
    model = tinn.NetworkWithInputEncoding(2, 3, {"otype": "Identity"}, {"otype": "FullyFusedMLP", "n_neurons": 16,
                                                                        "n_hidden_layers": 1}, n_instances=K, seed=2)
    trainer = tinn.Trainer(model, tinn.create_optimizer({"otype": "Adam"}), tinn.create_loss({"otype": "RelativeL2"}))
    lead = (K, 8) if routing == "dense" else (16,)
    wrap = put if path == "device" else (lambda a: a)
    x, target = wrap(rng.random(lead + (2,), dtype=np.float32)), wrap(rng.random(lead + (3,), dtype=np.float32))
    pdf = wrap(rng.random(lead + (3,), dtype=np.float32) + 0.5)
    instance = (np.arange(16, dtype=np.int32) % K) if routing == "routed" else None
    checks, check = [], batch.check_array
    monkeypatch.setattr(batch, "check_array", lambda a, name, *args: checks.append(name) or check(a, name, *args))
    runtime, bound = [], tinn.runtime.program.RuntimeBound._check_runtime
    monkeypatch.setattr(tinn.runtime.program.RuntimeBound, "_check_runtime",
                        lambda self: runtime.append(type(self).__name__) or bound(self))
    public = []
    for owner, name in ((model, "forward"), (model, "backward"), (trainer.loss, "evaluate"),
                        (trainer.optimizer, "step")):
        monkeypatch.setattr(owner, name, lambda *a, name=name, **k: public.append(name))
    for call in (trainer.training_step, trainer.forward):
        checks.clear()
        runtime.clear()
        call(x, target, instance, pdf)
        assert sorted(checks) == sorted(["x", "target", "pdf"] + (["instance"] if instance is not None else []))
        assert runtime == ["Trainer"]
    assert public == []
