"""The launch-cost tools of the benchmarks: counts per call, recorded launches and their empty twins, the
per-argument fit, and a compute graph against the same launches from Python."""
import os
import sys

import numpy as np
import pytest
import taichi as ti

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import _launches  # noqa: E402
import compute_graph  # noqa: E402
import launch_cost  # noqa: E402

ND = ti.types.ndarray(dtype=ti.f32, ndim=1)


@ti.kernel
def scaled(a: ND, out: ND, s: ti.f32, f: ti.template()):
    for i in a:
        out[i] = s * a[i] + f[None]


@pytest.fixture
def arrays():
    a, out = ti.ndarray(ti.f32, 8), ti.ndarray(ti.f32, 8)
    a.from_numpy(np.arange(8, dtype=np.float32))
    f = ti.field(ti.f32, ())
    f[None] = 0.5
    return a, out, f


def test_per_call_counts_launches_and_read_backs(arrays):
    """Two launches and one read-back (whose copy kernel is a launch too)."""
    a, out, f = arrays
    assert _launches.per_call(lambda: (scaled(a, out, 2.0, f), scaled(out, a, 1.0, f), out.to_numpy())) == \
        {"launches": 3, "read_backs": 1}


def test_recorded_launches_replay_and_twins_do_nothing(arrays, tmp_path):
    """A recorded launch replays to the same result; its empty twin takes the same arguments and leaves
    every array as it was."""
    a, out, f = arrays
    launches = launch_cost.record(lambda: scaled(a, out, 3.0, f))
    assert [(k.func.__name__, args[2]) for k, args, _ in launches] == [("scaled", 3.0)]
    expected = 3.0 * np.arange(8) + 0.5
    np.testing.assert_allclose(out.to_numpy(), expected)
    out.fill(0.0)
    kernel, args, kwargs = launches[0]
    kernel(*args, **kwargs)
    np.testing.assert_allclose(out.to_numpy(), expected)
    (twin,) = launch_cost.empty_twins([kernel], str(tmp_path))
    out.fill(-1.0)
    twin(*args, **kwargs)
    ti.sync()
    assert [a.name for a in twin._primal.arguments] == ["a", "out", "s", "f"]
    np.testing.assert_array_equal(out.to_numpy(), -1.0)
    np.testing.assert_array_equal(a.to_numpy(), np.arange(8))


def test_argument_costs_recover_a_linear_cost():
    """The least-squares fit returns the coefficients of exactly linear costs (copy kernels left out)."""
    rng = np.random.default_rng(3)
    truth = {"base": 20.0, "ndarrays": 7.0, "fields": 4.0, "scalars": 2.0}
    rows = []
    for i in range(12):
        n = dict(zip(("ndarrays", "fields", "scalars"), rng.integers(0, 9, 3).tolist()))
        us = truth["base"] + sum(truth[k] * v for k, v in n.items())
        rows.append({"kernel": f"k{i}", **n, "twin_us": us})
    rows.append({"kernel": "ndarray_to_ext_arr", "ndarrays": 2, "fields": 0, "scalars": 0, "twin_us": 1e4})
    assert launch_cost.argument_costs(rows) == pytest.approx(truth, abs=0.01)


def test_graph_leaves_the_same_arrays_as_python_launches():
    """Eight launches of the tinn-like cycle as one compute graph, against the same launches from Python."""
    assert compute_graph.same_result(64, 8, 8)


def test_graph_of_twins_holds_the_launches_without_host_arrays(arrays, tmp_path):
    """A step's launches as one graph of empty twins: the read-back's copy kernel (a host array argument)
    is left out, the template field is dropped, and running it leaves every array as it was."""
    a, out, f = arrays
    launches = launch_cost.record(lambda: (scaled(a, out, 2.0, f), out.to_numpy()))
    assert [k.func.__name__ for k, _, _ in launches] == ["scaled", "ndarray_to_ext_arr"]
    run, held = launch_cost.graph_of_twins(launches, str(tmp_path))
    assert held == 1
    out.fill(-1.0)
    run()
    np.testing.assert_array_equal(out.to_numpy(), -1.0)
    np.testing.assert_array_equal(a.to_numpy(), np.arange(8))
