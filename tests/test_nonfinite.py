"""Non-finite data (DESIGN: inputs, targets and pdf must be finite, pdf > 0): a ValueError naming the
argument and the first offending row, raised before anything changes."""
import numpy as np
import pytest

import tinn

CONFIG = {"loss": {"otype": "L2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
          "encoding": {"otype": "HashGrid", "n_levels": 2, "log2_hashmap_size": 6, "base_resolution": 4},
          "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}}
BAD = [np.nan, np.inf, -np.inf]
ROW = 5


@pytest.fixture
def model():
    return tinn.create_from_config(2, 3, CONFIG)


@pytest.fixture
def array_model():
    return tinn.create_from_config(2, 3, CONFIG, n_instances=3)


@pytest.fixture
def batch(rng):
    return (rng.random((16, 2), dtype=np.float32), rng.random((16, 3), dtype=np.float32),
            rng.uniform(0.5, 1.5, (16, 3)).astype(np.float32))


def spoiled(a, value, row=ROW, col=-1):
    a = a.copy()
    a[row, col] = value
    return a


def state(model):
    return (model.network.params(), model.network.gradients(), model.trainer.params_inference(),
            {k: np.array(v, copy=True) for k, v in model.optimizer.state_dict().items()})


def assert_unchanged(before, after):
    for a, b in zip(before[:3], after[:3]):
        np.testing.assert_array_equal(a, b)
    assert before[3].keys() == after[3].keys()
    for k in before[3]:
        np.testing.assert_array_equal(before[3][k], after[3][k])


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("argument", ["x", "target", "pdf"])
def test_training_step_rejects_non_finite_data_and_changes_nothing(model, batch, argument, value):
    model.trainer.training_step(*batch[:2], pdf=batch[2])           # some optimizer state to keep
    x, y, pdf = batch
    args = {"x": x, "target": y, "pdf": pdf}
    args[argument] = spoiled(args[argument], value)
    before = state(model)
    with pytest.raises(ValueError, match=rf"{argument} must be finite.*row {ROW} holds"):
        model.trainer.training_step(args["x"], args["target"], pdf=args["pdf"])
    with pytest.raises(ValueError, match=rf"{argument} must be finite.*row {ROW}"):
        model.trainer.forward(args["x"], args["target"], pdf=args["pdf"])
    assert_unchanged(before, state(model))


@pytest.mark.parametrize("value", [0.0, -1.0, -0.0])
def test_pdf_must_be_positive(model, batch, value):
    x, y, pdf = batch
    before = state(model)
    with pytest.raises(ValueError, match=rf"pdf must be finite and > 0: row {ROW} holds"):
        model.trainer.training_step(x, y, pdf=spoiled(pdf, value))
    assert_unchanged(before, state(model))


@pytest.mark.parametrize("value", BAD)
def test_forward_and_inference_reject_non_finite_inputs(model, batch, value):
    x = spoiled(batch[0], value, col=0)
    for call in (model.network.forward, model.network.inference, model.network.encoding.inference):
        with pytest.raises(ValueError, match=rf"x must be finite: row {ROW} holds"):
            call(x)
    net = tinn.create_network(2, 3, CONFIG["network"])
    with pytest.raises(ValueError, match=rf"x must be finite: row {ROW}"):
        net.inference(x)


@pytest.mark.parametrize("value", BAD)
def test_loss_evaluate_rejects_non_finite_targets_and_pdfs(model, batch, value):
    x, y, pdf = batch
    prediction = model.network.inference(x)
    with pytest.raises(ValueError, match=rf"target must be finite: row {ROW}"):
        model.loss.evaluate(prediction, spoiled(y, value))
    with pytest.raises(ValueError, match=rf"pdf must be finite and > 0: row {ROW}"):
        model.loss.evaluate(prediction, y, spoiled(pdf, value))
    with pytest.raises(ValueError, match=rf"pdf must be finite and > 0: row {ROW}"):
        model.loss.evaluate(prediction, y, spoiled(pdf, 0.0))


def test_a_non_finite_prediction_is_not_rejected(model, batch):
    """A diverged network's NaN output is the loss's input, not user data: it gives a NaN loss."""
    x, y, _ = batch
    loss, _ = model.loss.evaluate(spoiled(model.network.inference(x), np.nan), y)
    assert np.isnan(loss)


@pytest.mark.parametrize("argument", ["x", "target", "pdf"])
def test_routed_and_dense_batches_name_the_row(array_model, rng, argument):
    x = rng.random((3, 8, 2), dtype=np.float32)
    y = rng.random((3, 8, 3), dtype=np.float32)
    pdf = np.ones((3, 8, 3), np.float32)
    ids = np.repeat(np.arange(3, dtype=np.int32), 8)
    before = state(array_model)
    dense = {"x": x, "target": y, "pdf": pdf}
    dense[argument] = dense[argument].copy()
    dense[argument][1, 2, 0] = np.nan
    with pytest.raises(ValueError, match=rf"{argument} must be finite.*row \(1, 2\)"):
        array_model.trainer.training_step(dense["x"], dense["target"], pdf=dense["pdf"])
    flat = {k: v.reshape(24, -1) for k, v in dense.items()}
    with pytest.raises(ValueError, match=rf"{argument} must be finite.*row 10 holds nan"):
        array_model.trainer.training_step(flat["x"], flat["target"], ids, pdf=flat["pdf"])
    assert_unchanged(before, state(array_model))
    if argument == "x":
        with pytest.raises(ValueError, match=r"x must be finite: row 10"):
            array_model.network.inference(flat["x"], ids)


def test_large_finite_values_are_accepted(model, batch):
    """The check must not overflow: sums of large finite values are infinite, the values are not."""
    x, y, pdf = batch
    huge = np.finfo(np.float32).max
    model.loss.evaluate(model.network.inference(x), np.full_like(y, huge), np.full_like(pdf, huge))
    net = tinn.create_network(2, 3, CONFIG["network"])
    assert net.inference(np.full_like(x, huge)).shape == (16, 3)
