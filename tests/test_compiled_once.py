"""Kernels keyed on what changes their code: a grid of another resolution, scale or table size, an optimizer of
another parameter count and an MLP of another width run kernels already compiled (``compiles.compilations``
counts new instantiations), and compute what their formulas say (the references of test_encodings /
test_optimizers)."""
import numpy as np
import pytest

import tinn
from compiles import compilations
from tinn.runtime.program import is_cpu
from reference import assert_close, grid_geometry, grid_input_grad_ref, grid_param_grad_ref, grid_ref, interior_points
from test_optimizers import adam_reference

ON_FIELDS = "off the CPU a kernel taking parameter memory compiles once per arena chunk (docs/memory.md)"


def _grid(grid_type, alignment=1, n_instances=1, **keys):
    config = {"otype": "Grid", "type": grid_type, "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 7,
              "base_resolution": 4, "per_level_scale": 1.5, **keys}
    enc = tinn.create_encoding(2, config, alignment=alignment, n_instances=n_instances)
    levels = grid_geometry(2, grid_type, 4, config["log2_hashmap_size"], config["base_resolution"],
                           config["per_level_scale"])
    return enc, levels


def _check_grid(enc, levels, seed):
    """Forward, parameter gradient and input gradient of ``enc`` (each of its networks, samples routed at random)
    against the references; its padded columns are zero."""
    rng = np.random.default_rng(seed)
    K, raw = enc.n_instances, 8
    p = rng.uniform(-1, 1, (K, enc.n_params)).astype(np.float32)
    enc.set_params(p if K > 1 else p[0])
    x = interior_points(rng, 300, 2, levels, margin=1e-3)
    inst = rng.integers(0, K, 300).astype(np.int32)
    dL_dy = rng.normal(size=(300, enc.n_output_dims)).astype(np.float32)
    y, ctx = enc.forward(x, inst if K > 1 else None)
    dx = enc.backward(ctx, dL_dy, input_gradient=True)
    grads = enc.gradients().reshape(K, enc.n_params)
    assert not y[:, raw:].any()
    for k in range(K):
        m = inst == k
        assert_close(y[m, :raw], grid_ref(x[m], p[k], levels, 2, "Linear"), rtol=1e-5, atol=1e-6)
        assert_close(grads[k], grid_param_grad_ref(x[m], dL_dy[m, :raw], levels, 2, "Linear", enc.n_params),
                     rtol=1e-4, atol_rel=1e-5)
        assert_close(dx[m], grid_input_grad_ref(x[m], p[k], dL_dy[m, :raw], levels, 2, "Linear"), rtol=1e-4,
                     atol_rel=1e-5)


def _index_modes(levels, D=2):
    """Per level: hashed, dense, or dense modulo its table (tcnn's three ways to an entry)."""
    return tuple("hashed" if l.hashed else "dense" if l.res ** D <= l.entries else "modulo" for l in levels)


@pytest.mark.parametrize("grid_type", ["Hash", "Tiled"])
def test_a_grid_of_another_geometry_compiles_nothing(grid_type):
    """Resolution, scale and table size are data the kernels read (``_grid_tables``): the levels of the second
    and later grids move between index modes at other levels, and their tables have other sizes. On the CPU they
    compile nothing; elsewhere only the per-block sums of the levels of small tables may compile again (their
    shared memory is static: one kernel per power of two of the largest such table, ``_grid_block``)."""
    first, levels = _grid(grid_type)
    _check_grid(first, levels, 0)
    modes = {_index_modes(levels)}
    for i, keys in enumerate(({"per_level_scale": 1.7}, {"base_resolution": 5}, {"log2_hashmap_size": 9},
                              {"base_resolution": 9, "per_level_scale": 2.0, "log2_hashmap_size": 11},
                              {"base_resolution": 2, "per_level_scale": 2.5},
                              {"base_resolution": 16, "per_level_scale": 1.2}, {"per_level_scale": 1.0})):
        enc, levels = _grid(grid_type, **keys)
        modes.add(_index_modes(levels))
        with compilations() as names:
            _check_grid(enc, levels, i + 1)
        if is_cpu():
            assert names == [], (keys, names)
        elif "_addresses" not in names:      # else a new arena chunk: new fields, every kernel again (ON_FIELDS)
            others = [k.func.__name__ for k in names.kernels if k.func.__module__ != "tinn.encodings._grid_block"]
            assert len(names) <= 1 and others == [], (keys, names)
    assert len(modes) >= (3 if grid_type == "Hash" else 2), modes     # where one mode gives way to the next moves
    if grid_type == "Hash":
        assert ("hashed",) * 4 in modes and ("dense",) * 4 in modes, modes


@pytest.mark.x64_only(ON_FIELDS)
def test_a_grid_of_another_padding_or_number_of_networks_runs_the_same_kernels():
    """The padded width is the output's columns and the number of networks the gradients' rows, both read at run
    time: after an array of 2 grids, one padded to 16 columns compiles nothing, and an array of 3 at most the
    private gradient tables' scatter and reduction (their tables hold a row per network: those of 3 networks may
    have run before)."""
    first, levels = _grid("Hash", n_instances=2)
    _check_grid(first, levels, 0)
    for create, expected in (({"alignment": 16}, []), ({"n_instances": 3}, ["reduce_private", "scatter"])):
        enc, levels = _grid("Hash", **{"n_instances": 2, **create})
        with compilations() as names:
            _check_grid(enc, levels, 1)
        assert set(names) <= set(expected) and len(names) == len(set(names)), (create, names)


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
