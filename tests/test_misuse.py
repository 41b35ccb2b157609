"""Misuse gets a clear error (or a documented safe behaviour) before anything changes: per-sample funcs
with a network id out of range, in an autodiff kernel or given a vector of the wrong length; grids whose
levels shrink below one cell; hostile parameter values, ids and dtypes; initial draws of large models."""
import math

import numpy as np
import pytest
import taichi as ti
import torch
from reference import Pcg32Ref
from taichi.lang.exception import TaichiCompilationError

import tinn
from tinn.runtime import rng as _rng
from tinn.torch._tensors import instances

NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "Tanh",
       "output_activation": "None"}
GRID = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 6,
        "base_resolution": 4, "per_level_scale": 1.5}
FREQ = {"otype": "Frequency", "n_frequencies": 1}
IDS = [0, 1, 2, -1, 2 ** 31 - 1, -2 ** 31]            # two networks: the last four are outside the array


@pytest.fixture(scope="module")
def arrays():
    """An array of two networks and a model allocated after it (its neighbour in the parameter arena)."""
    model = tinn.NetworkWithInputEncoding(2, 1, FREQ, NET, n_instances=2)
    neighbour = tinn.NetworkWithInputEncoding(2, 1, FREQ, NET)
    return model, neighbour


def run_funcs(model, x, ids):
    """``func``, ``backward_func`` (dL/dy = 1) and ``jacobian_func`` of every sample, in one user kernel."""
    f, b, j = model.func, model.backward_func, model.jacobian_func
    y, dx, J = (np.zeros((len(x), 2), np.float32) for _ in range(3))

    @ti.kernel
    def run(x: ti.types.ndarray(), ids: ti.types.ndarray(), y: ti.types.ndarray(), dx: ti.types.ndarray(),
            J: ti.types.ndarray()):
        for s in range(x.shape[0]):
            xv = ti.Vector([x[s, 0], x[s, 1]])
            y[s, 0] = f(xv, ids[s])[0]
            g = b(xv, ti.Vector([1.0]), ids[s])
            _, jac = j(xv, ids[s])
            for d in ti.static(range(2)):
                dx[s, d], J[s, d] = g[d], jac[0, d]

    run(x, np.asarray(ids, np.int32), y, dx, J)
    return y[:, 0], dx, J


def test_funcs_with_a_network_id_outside_the_array_give_zero_and_write_nothing(arrays, rng):
    model, neighbour = arrays
    x = np.repeat(rng.random((1, 2), dtype=np.float32), len(IDS), axis=0)
    model.zero_grad()
    neighbour.zero_grad()
    y, dx, J = run_funcs(model, x, IDS)
    inside = np.array([0 <= k < 2 for k in IDS])
    np.testing.assert_allclose(y[inside], model.inference(x[inside], instance=np.array(IDS, np.int32)[inside])[:, 0],
                               rtol=1e-5, atol=1e-6)
    assert np.all(y[~inside] == 0) and np.all(dx[~inside] == 0) and np.all(J[~inside] == 0)
    assert np.all(np.abs(dx[inside]).sum(axis=1) > 0)
    np.testing.assert_allclose(dx[inside], J[inside], rtol=1e-4, atol=1e-6)
    grads = model.gradients()
    assert np.all(np.abs(grads).sum(axis=1) > 0)               # networks 0 and 1 got their own samples' gradients
    assert not np.any(neighbour.gradients())                   # the neighbour in the arena got nothing

    model.zero_grad()
    run_funcs(model, x[~inside], np.array(IDS)[~inside])       # only ids outside: nothing anywhere
    assert not np.any(model.gradients()) and not np.any(neighbour.gradients())


def _user_kernel(model, kind):
    """A user kernel calling ``model``'s func ``kind``, accumulating into ``loss``."""
    f = getattr(model, kind)
    x = ti.field(ti.f32, 4, needs_grad=True, needs_dual=True)
    loss = ti.field(ti.f32, (), needs_grad=True, needs_dual=True)

    @ti.kernel
    def render():
        for i in x:
            p = ti.Vector([x[i], 0.5])
            if ti.static(kind == "backward_func"):
                loss[None] += f(p, ti.Vector([1.0]))[0]
            elif ti.static(kind == "jacobian_func"):
                loss[None] += f(p)[1][0, 0]
            else:
                loss[None] += f(p)[0]

    return render, x, loss


@pytest.mark.parametrize("kind", ["func", "forward_func", "backward_func", "jacobian_func"])
def test_a_func_in_a_reverse_mode_kernel_is_a_compile_time_error_naming_the_stages(arrays, kind):
    _, model = arrays
    render, _, _ = _user_kernel(model, kind)
    with pytest.raises(TaichiCompilationError, match=r"tinn\.ad\.stage.*tinn\.ad\.gradient_stage"):
        render.grad()                                   # what ti.ad.Tape runs on exit


def test_a_func_under_a_tape_or_in_forward_mode_raises_at_once(arrays):
    _, model = arrays
    render, x, loss = _user_kernel(model, "func")
    before = model.params()
    with pytest.raises(TaichiCompilationError, match="reverse mode"):
        with ti.ad.Tape(loss=loss):
            render()
    with pytest.raises(TaichiCompilationError, match="forward mode"):
        with ti.ad.FwdMode(loss=loss, param=x, seed=[1.0, 0.0, 0.0, 0.0]):
            render()
    np.testing.assert_array_equal(model.params(), before)


@pytest.mark.parametrize("enc", [{"otype": "Identity"}, {"otype": "Frequency", "n_frequencies": 2},
                                 {"otype": "OneBlob", "n_bins": 4}, GRID])
def test_a_vector_of_the_wrong_length_is_a_compile_time_error_naming_the_key(enc):
    encoding = tinn.create_encoding(2, enc)
    f = encoding.func

    @ti.kernel
    def three():
        print(f(ti.Vector([0.1, 0.2, 0.3]))[0])

    @ti.kernel
    def scalar():
        print(f(0.1)[0])

    with pytest.raises(TaichiCompilationError, match=r"n_input_dims = 2\), not 3 components"):
        three()
    with pytest.raises(TaichiCompilationError, match=r"n_input_dims = 2\), not a scalar"):
        scalar()


def test_an_output_gradient_of_the_wrong_length_names_n_output_dims(arrays):
    _, model = arrays
    b = model.backward_func

    @ti.kernel
    def wrong():
        print(b(ti.Vector([0.1, 0.2]), ti.Vector([1.0, 1.0]))[0])

    with pytest.raises(TaichiCompilationError, match=r"dL_dy.*n_output_dims = 1\), not 2 components"):
        wrong()


@pytest.mark.x64_only("config validation")
@pytest.mark.parametrize("otype", ["HashGrid", "DenseGrid", "TiledGrid"])
def test_grid_levels_that_shrink_below_one_cell_are_refused(otype):
    for scale, levels, first_bad in [(1e-3, 4, 1), (1e-30, 2, 1), (0.8, 100, 13)]:
        assert 16 * scale ** first_bad < 1 <= 16 * scale ** (first_bad - 1)        # the level that shrinks
        with pytest.raises(ValueError, match=f"'per_level_scale'.*level {first_bad} below one cell"):
            tinn.create_encoding(3, {"otype": otype, "n_levels": levels, "per_level_scale": scale,
                                     "base_resolution": 16, "log2_hashmap_size": 8})
    with pytest.raises(ValueError, match="below one cell"):
        tinn.encodings.GridEncoding(2, type="Dense", n_levels=3, base_resolution=2, per_level_scale=0.1)
    shrinking = tinn.create_encoding(3, {"otype": otype, "n_levels": 8, "per_level_scale": 0.8,
                                         "base_resolution": 16, "log2_hashmap_size": 8})
    assert [level[1] for level in shrinking.levels] == [math.ceil(16 * 0.8 ** l - 1) + 1 for l in range(8)]


@pytest.mark.x64_only("parameter validation on the host")
def test_set_params_refuses_nan_infinities_and_float32_overflow(arrays):
    model, _ = arrays
    before = model.params()
    for bad, what in [(np.nan, "NaN"), (np.inf, "inf"), (1e39, "overflow"), (-3.5e38, "overflow")]:
        values = before.astype(np.float64)
        values[1, 3] = bad
        with pytest.raises(ValueError, match=f"finite float32.*1 are not.*index {model.n_params + 3}"):
            model.set_params(values)
        np.testing.assert_array_equal(model.params(), before, err_msg=what)
    model.set_params(before.astype(np.float64) * 0.5)          # float64 within range: accepted
    np.testing.assert_array_equal(model.params(), before * np.float32(0.5))
    model.set_params(before)


@pytest.mark.x64_only("torch-level id and dtype checks")
def test_torch_ids_beyond_int32_and_bfloat16_batches_are_refused(arrays):
    model, _ = arrays
    for ids in (torch.tensor([0, 2 ** 32 + 1]), np.array([2 ** 32 + 1, 0], np.int64), [0, -2 ** 31 - 1]):
        with pytest.raises(ValueError, match="beyond int32"):
            instances(ids)
    np.testing.assert_array_equal(instances(torch.tensor([1, 0])), [1, 0])
    with pytest.raises(TypeError, match="x must have dtype float32.*bfloat16"):
        model.inference(torch.zeros(8, 2, dtype=torch.bfloat16), instance=np.zeros(8, np.int32))


@pytest.mark.x64_only("config validation")
def test_oneblob_bins_are_bounded():
    for otype, n_in in (("OneBlob", 2), ("NRC", 8)):
        with pytest.raises(ValueError, match="'n_bins' must be a power of two of at most 4096; got 1048576"):
            tinn.create_encoding(n_in, {"otype": otype, "n_bins": 2 ** 20})
    assert tinn.create_encoding(1, {"otype": "OneBlob", "n_bins": 4096}).n_output_dims == 4096


@pytest.mark.x64_only("optimizer step bookkeeping")
def test_optimizer_step_with_no_active_network_changes_nothing(rng):
    config = {"loss": {"otype": "L2"}, "optimizer": {"otype": "Adam", "learning_rate": 0.1},
              "encoding": {"otype": "Identity"}, "network": NET}
    model = tinn.create_from_config(2, 1, config, n_instances=2)
    x, y = rng.random((64, 2), dtype=np.float32), rng.random((64, 1), dtype=np.float32)
    model.trainer.backward(model.trainer.forward(x, y, instance=np.arange(64, dtype=np.int32) % 2))
    assert np.all(np.abs(model.network.gradients()).sum(axis=1) > 0)
    before = model.network.params()
    for active in ([], (), np.array([], np.int32)):
        model.trainer.optimizer_step(active=active)
        np.testing.assert_array_equal(model.network.params(), before)
        np.testing.assert_array_equal(model.trainer.optimizer.step_counts(), [0, 0])
    model.trainer.optimizer_step(active=[1])                    # the same gradients, network 1 stepped
    after = model.network.params()
    np.testing.assert_array_equal(after[0], before[0])
    assert np.any(after[1] != before[1])


@pytest.mark.x64_only("host random draws")
def test_initial_draws_in_chunks_equal_the_reference(monkeypatch):
    monkeypatch.setattr(_rng, "CHUNK", 5)
    lib, ref = _rng.Pcg32(1337, 3), Pcg32Ref(1337, 3)
    np.testing.assert_array_equal(lib.uniform_fill(23), ref.uniform_fill(23))
    np.testing.assert_array_equal(lib.draws(17), ref.floats(17))
    pair = _rng.Pcg32(7, seq=np.array([1, 2])).uniform_fill(11)
    np.testing.assert_array_equal(pair[1], Pcg32Ref(7, 2).uniform_fill(11))


@pytest.mark.x64_only("host random draws")
def test_running_out_of_memory_while_drawing_names_the_component(monkeypatch):
    grid = tinn.create_encoding(3, {"otype": "DenseGrid", "n_levels": 2, "base_resolution": 4, "per_level_scale": 1.5,
                                    "n_features_per_level": 4})
    before = grid.params()

    def out_of_memory(self, n):
        raise MemoryError("Unable to allocate")

    monkeypatch.setattr(_rng.Pcg32, "uniform_fill", out_of_memory)
    with pytest.raises(MemoryError, match=r"'type': 'Dense'.*'base_resolution': 4.*initial parameters of 1 x "
                                          rf"{grid.n_params} float32"):
        grid.reset_params(3)
    np.testing.assert_array_equal(grid.params(), before)


@pytest.mark.x64_only("host address-space limit, in a subprocess")
def test_under_an_address_space_limit_a_model_is_refused_before_taichi_and_the_next_one_builds():
    from test_memory import run
    out = run("""
        import resource
        used = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (used + (400 << 20), resource.RLIM_INFINITY))   # 400 MiB more
        big = {"otype": "FullyFusedMLP", "n_neurons": 4000, "n_hidden_layers": 3}    # 6 x 128 MiB with its draw
        try:
            tinn.create_from_config(2, 3, {"encoding": {"otype": "Identity"}, "network": big})
            result = ["built"]
        except Exception as e:
            result = [type(e).__name__, str(e)]
        m = tinn.create_from_config(2, 3, {"encoding": GRID, "network": NET})       # the first allocation after it
        print(json.dumps(result + [float(m.trainer.training_step(x, y))]))
    """, timeout=300)
    kind, message, loss = out
    assert kind == "ValueError", out
    assert "'n_neurons': 4000" in message and "GiB" in message, message
    assert np.isfinite(loss)
