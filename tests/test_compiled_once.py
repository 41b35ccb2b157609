"""Kernels keyed on what changes their code: an optimizer of another parameter count and an MLP of another width
run kernels already compiled (``compiles.compilations`` counts new instantiations), and compute what their
formulas say (test_optimizers' references)."""
import numpy as np
import pytest

import tinn
from compiles import compilations
from test_optimizers import adam_reference

ON_FIELDS = "off the CPU a kernel taking parameter memory compiles once per arena chunk (docs/memory.md)"


@pytest.mark.parametrize("otype", ["Adam", "SGD"])
def test_an_optimizer_of_another_parameter_count_compiles_nothing(otype, rng):
    """The step kernel takes the parameter counts at run time: a second size steps as its formula says."""
    keys = {"learning_rate": 0.05, "l2_reg": 0.01}
    for n, n_matrix, compiled in ((40, 24, None), (72, 48, [])):
        w0 = rng.normal(size=n).astype(np.float32)
        grads = [rng.normal(size=n).astype(np.float32) for _ in range(3)]
        opt = tinn.create_optimizer({"otype": otype, **keys})
        opt.allocate(n, [(4, n_matrix // 4)])
        w = w0.copy()
        with compilations() as names:
            for g in grads:
                opt.step(w, g)
        if compiled is not None:
            assert names == compiled, names
        if otype == "Adam":
            expected = adam_reference(w0, grads, n_matrix, lr=0.05, l2_reg=0.01)
        else:
            expected = w0.astype(np.float64)
            for g in grads:
                expected = expected - 0.05 * (g + 0.01 * expected)
        np.testing.assert_allclose(w, expected, rtol=2e-5, atol=2e-6)


@pytest.mark.x64_only(ON_FIELDS)
@pytest.mark.parametrize("otype", ["Adam", "SGD"])
def test_a_training_step_of_another_mlp_width_compiles_nothing(otype):
    """A model 16 wide, then one 32 wide: the second's training step (its optimizer step included) and inference
    run kernels already compiled."""
    rng = np.random.default_rng(3)
    x, y = rng.random((256, 2), dtype=np.float32), rng.random((256, 3), dtype=np.float32)
    for width, compiled in ((16, None), (32, [])):
        model = tinn.create_from_config(2, 3, {
            "encoding": {"otype": "Frequency", "n_frequencies": 2},
            "network": {"otype": "FullyFusedMLP", "n_neurons": width, "n_hidden_layers": 1},
            "optimizer": {"otype": otype, "learning_rate": 1e-2}, "loss": {"otype": "L2"}})
        before = model.network.params()
        with compilations() as names:
            model.trainer.training_step(x, y)
            model.network.inference(x)
        if compiled is not None:
            assert names == compiled, names
        assert np.isfinite(model.network.params()).all() and not np.array_equal(model.network.params(), before)
