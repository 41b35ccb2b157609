"""One Taichi runtime for the whole session: the CPU, or the arch named by ``TINN_ARCH`` (``vulkan``,
``cuda``, ``metal``, ...).

Taichi falls back to the CPU when the asked-for arch has no driver; here that is an error instead,
so a run meant for Vulkan never quietly tests the CPU. Tests that only make sense on the CPU backend
carry ``@pytest.mark.x64_only(reason)`` and are skipped elsewhere, with that reason. Tests whose kernels
take minutes to compile through Mesa's software Vulkan driver carry ``@pytest.mark.long_compile(reason)``
and are skipped on Vulkan unless ``TINN_LONG_COMPILES=1`` (CI's time; the same code paths stay covered
there by smaller tests). ``TINN_SHARD=i/n`` runs the i-th of n parts of the suite, so that CI can run one arch's
pass as n processes side by side: whole test files, dealt longest first to the part with the least time so far,
by the seconds ``shard_costs.json`` holds for the arch (measured: ``.ci/shard_costs.py``; a file not measured
counts as the median one).

The README's command runs the suite in two worker processes (pytest-xdist's ``-n 2``; each worker takes whole test
files, ``--dist loadfile``, so that a file's tests share its kernels); a run without ``-n`` runs it in this one.

The default suite (the README's command) runs every check on a covering sample; ``TINN_FULL=1`` runs the full
suite (what CI runs). A sweep's parameters go through ``sample(items, k)``: all of them in the full suite, an
evenly spread ``k`` of them (first and last included) otherwise. A whole test marked
``@pytest.mark.full_only(reason)`` runs in the full suite only. Tests whose work does not depend on
``TINN_ARCH`` (subprocesses that always start ``ti.cpu``, scans that always start Vulkan, argument parsing)
carry ``@pytest.mark.arch_independent(reason)`` and run in the CPU pass only. The report says how many tests
the default suite left out.
"""
import contextlib
import json
import os
import statistics

import numpy as np
import pytest
import taichi as ti
from taichi.lang import impl

ARCH = os.environ.get("TINN_ARCH", "cpu")
FULL = os.environ.get("TINN_FULL") == "1"
FULL_COMMAND = "TINN_FULL=1 python -m pytest -q -n 2 tests"
_LEFT_OUT = pytest.StashKey[int]()
_PARAM = type(pytest.param(None))


def sample(items, k: int = 3, *, keep=None) -> list:
    """``items`` for ``pytest.mark.parametrize``, every one run in the full suite (``TINN_FULL=1``) and in the
    default suite only ``k`` evenly spread ones (the first and the last among them), or those in ``keep``
    (values of a single argname, else indices). The others carry the ``full_only`` mark. An item that is a
    tuple gives one value per argname (wrap a single argname's tuple value in ``pytest.param`` first)."""
    items = list(items)
    n = len(items)
    if keep is None:
        keep = {0} if k <= 1 or n <= 1 else {round(i * (n - 1) / (k - 1)) for i in range(min(k, n))}
    else:
        values = [item.values[0] if isinstance(item, _PARAM) else item for item in items]
        unknown = [v for v in keep if v not in values and not isinstance(v, int)]
        if unknown:
            raise ValueError(f"sample: keep names {unknown}, not among the items")
        keep = {values.index(v) if v in values else v % n for v in keep}
    mark = pytest.mark.full_only("a sweep's other values: the default suite runs a spread sample")
    out = []
    for i, item in enumerate(items):
        if i in keep:
            out.append(item)
        elif isinstance(item, _PARAM):
            out.append(pytest.param(*item.values, marks=[*item.marks, mark], id=item.id))
        else:
            out.append(pytest.param(*(item if isinstance(item, tuple) else (item,)), marks=mark))
    return out


def spread(items, k: int) -> list:
    """The items ``sample`` would keep by default, or all of them under ``TINN_FULL=1``: for loops inside a
    test (events, cases, seeds)."""
    items = list(items)
    if FULL or len(items) <= k:
        return items
    return [items[i] for i in sorted({round(i * (len(items) - 1) / (k - 1)) for i in range(k)})] if k > 1 else items[:1]


def _worker(config) -> bool:
    return hasattr(config, "workerinput")


def _controller(config) -> bool:
    """Whether this process only hands test files to xdist's workers (it runs no test and starts no Taichi)."""
    return not _worker(config) and bool(getattr(config.option, "numprocesses", None))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") == "no":
        config.option.dist = "loadfile"             # a file's tests in one worker: they share its kernels
        config.option.loadscopereorder = False      # files in the workers' order: the longest first


def pytest_configure(config):
    config.addinivalue_line("markers", "x64_only(reason): the test checks something that exists only on the "
                                       "CPU (x64) backend; skipped on other archs")
    config.addinivalue_line("markers", "long_compile(reason): a test whose kernels compile for minutes through a "
                                       "software Vulkan driver (llvmpipe); skipped on Vulkan unless TINN_LONG_COMPILES=1")
    config.addinivalue_line("markers", "full_only(reason): runs only in the full suite (TINN_FULL=1, what CI "
                                       "runs); the default suite covers the same code with a sample")
    config.addinivalue_line("markers", "arch_independent(reason): the test's work does not depend on TINN_ARCH "
                                       "(a subprocess that starts its own arch, argument parsing); CPU pass only")
    if not hasattr(ti, ARCH):
        raise pytest.UsageError(f"TINN_ARCH={ARCH!r} is not a Taichi arch")
    if _controller(config):
        return
    ti.init(arch=getattr(ti, ARCH), enable_fallback=False, offline_cache=True, log_level=ti.WARN)
    wanted = {"cpu": (ti.x64, ti.arm64)}.get(ARCH, (getattr(ti, ARCH),))
    if impl.current_cfg().arch not in wanted:
        raise pytest.UsageError(f"TINN_ARCH={ARCH}: Taichi runs on {impl.current_cfg().arch}, not {ARCH}")


def pytest_report_header(config):
    suite = "full suite (TINN_FULL=1)" if FULL else f"default suite (the full one: {FULL_COMMAND})"
    arch = ARCH if _controller(config) else impl.current_cfg().arch.name
    return [f"taichi arch: {arch}", f"tinn: {suite}"]


def pytest_report_collectionfinish(config, start_path, items):
    left = config.stash.get(_LEFT_OUT, 0)
    if left:
        return f"the default suite leaves out {left} tests of sweeps and loops; all of them: {FULL_COMMAND}"
    return []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """(xdist) A worker's count of the tests the default suite left out: every worker collects the whole suite."""
    left = getattr(node, "workeroutput", {}).get("tinn_left_out")
    if left is not None:
        node.config.stash[_LEFT_OUT] = left


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    left = config.stash.get(_LEFT_OUT, 0)
    if left:
        terminalreporter.write_line(f"tinn: {left} tests left out of the default suite (sampled sweeps, long "
                                    f"loops); to run them all: {FULL_COMMAND}")


def _shard():
    """``(i, n)`` from ``TINN_SHARD=i/n`` (1 <= i <= n), or ``None``."""
    value = os.environ.get("TINN_SHARD")
    if not value:
        return None
    try:
        i, n = (int(v) for v in value.split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise pytest.UsageError(f"TINN_SHARD={value!r}: expected i/n with 1 <= i <= n")
    return i, n


def _file(item) -> str:
    return item.nodeid.split("::")[0]


def _costs(suite: str = "full") -> dict:
    """Each test file's measured seconds (``shard_costs.json``): the full suite's on this arch, or the default
    suite's (``"default"``, on the CPU)."""
    with open(os.path.join(os.path.dirname(__file__), "shard_costs.json")) as f:
        costs = json.load(f)
    return costs.get("default" if suite == "default" else "cpu" if ARCH == "cpu" else ARCH, {})


def _parts(files, n: int, costs: dict) -> dict:
    """Each test file's part (0 to n - 1): longest first, each to the part with the least time so far."""
    default = statistics.median(costs.values()) if costs else 1.0
    loads, part = [0.0] * n, {}
    for f in sorted(files, key=lambda f: (-costs.get(f, default), f)):
        j = loads.index(min(loads))
        part[f], loads[j] = j, loads[j] + costs.get(f, default)
    return part


def pytest_collection_modifyitems(config, items):
    if not FULL:
        left = [item for item in items if item.get_closest_marker("full_only") is not None]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = [item for item in items if item.get_closest_marker("full_only") is None]
        config.stash[_LEFT_OUT] = len(left)
        if _worker(config):
            config.workeroutput["tinn_left_out"] = len(left)
    shard = _shard()
    if shard is not None:
        i, n = shard
        part = _parts({_file(item) for item in items}, n, _costs())
        mine, others = [], []
        for item in items:
            (mine if part[_file(item)] == i - 1 else others).append(item)
        config.hook.pytest_deselected(items=others)
        items[:] = mine
    if _worker(config):                 # xdist hands out files in this order: the longest first, so none is left last
        costs = _costs("full" if FULL else "default")
        default = statistics.median(costs.values()) if costs else 1.0
        items.sort(key=lambda item: -costs.get(_file(item), default))
    for item in items if ARCH != "cpu" else ():
        mark = item.get_closest_marker("arch_independent")
        if mark is not None:
            reason = mark.args[0] if mark.args else mark.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"arch-independent, runs in the CPU pass: {reason}"))
    if impl.current_cfg().arch == ti.x64:
        return
    long_compiles = impl.current_cfg().arch == ti.vulkan and os.environ.get("TINN_LONG_COMPILES") != "1"
    for item in items:
        mark = item.get_closest_marker("x64_only")
        if mark is not None:
            reason = mark.args[0] if mark.args else mark.kwargs.get("reason", "x64 backend only")
            item.add_marker(pytest.mark.skip(reason=f"x64 only: {reason}"))
        mark = item.get_closest_marker("long_compile")
        if mark is not None and long_compiles:
            item.add_marker(pytest.mark.skip(reason=f"long compile on Vulkan (TINN_LONG_COMPILES=1 runs it): {mark.args[0]}"))


# -- canonical small configs: files that share them share their kernels in one process --------------------------
SMALL_GRID = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 6, "base_resolution": 4,
              "per_level_scale": 2.0}
"""Two levels, the finer one hashed (2^6 entries): a grid that compiles fast and still exercises hashing."""
SMALL_NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}
"""One hidden layer of 16 (ReLU, no output activation)."""
SMOOTH_NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": "Tanh",
              "output_activation": "None"}
"""Smooth everywhere: for finite differences and second order."""
SMOOTH_ENCODING = {"otype": "Frequency", "n_frequencies": 2}
"""A smooth encoding without parameters."""
SMALL_CONFIG = {"encoding": SMALL_GRID, "network": SMALL_NET, "loss": {"otype": "L2"},
                "optimizer": {"otype": "Adam", "learning_rate": 1e-2}}
"""A whole model: ``tinn.create_from_config(2, 3, SMALL_CONFIG)``."""


def small_config_hash() -> dict:
    """tcnn's ``config_hash`` with 8 levels of at most 2^13 entries, 72 thousand parameters instead of 708
    thousand: its components and keys and its runs of levels (dense, then hashed; off the CPU the coarse ones summed
    per block, then dense and hashed ones added atomically, as config_hash's), so the same kernels and launches."""
    from tinn.registry import load_config
    config = load_config("config_hash")
    config["encoding"].update(n_levels=8, log2_hashmap_size=13)
    return config


def run_funcs(obj, x, dy, instance=None):
    """``(y, dL/dx, gradients)``: ``obj.func`` and ``obj.backward_func`` of each sample (routed to network
    ``instance[b]``, or 0), called from kernels of our own, one func each (Taichi's compile time grows faster than a
    kernel's size); the gradients are what ``backward_func`` added to zero."""
    f, bf = obj.func, obj.backward_func
    n_in, n_out = obj.n_input_dims, obj.n_output_dims
    ids = np.zeros(len(x), np.int32) if instance is None else np.asarray(instance, np.int32)

    @ti.kernel
    def user_forward(x: ti.types.ndarray(), ids: ti.types.ndarray(), y: ti.types.ndarray()):
        for b in range(x.shape[0]):
            out = f(ti.Vector([x[b, i] for i in ti.static(range(n_in))]), ids[b])
            for i in range(n_out):
                y[b, i] = out[i]

    @ti.kernel
    def user_backward(x: ti.types.ndarray(), dy: ti.types.ndarray(), ids: ti.types.ndarray(), dx: ti.types.ndarray()):
        for b in range(x.shape[0]):
            gv = ti.Vector.zero(ti.f32, n_out)
            for i in range(n_out):
                gv[i] = dy[b, i]
            g = bf(ti.Vector([x[b, i] for i in ti.static(range(n_in))]), gv, ids[b])
            for i in ti.static(range(n_in)):
                dx[b, i] = g[i]

    y, dx = np.zeros((len(x), n_out), np.float32), np.zeros_like(x)
    if obj.n_params:
        obj.zero_grad()
    user_forward(x, ids, y)
    user_backward(x, dy, ids, dx)
    return y, dx, obj.gradients()


@pytest.fixture(scope="session")
def small_model():
    """``NetworkWithInputEncoding(2, 3, SMALL_GRID, SMALL_NET)``, one for the session: for tests that only read
    it (inference, passes, which overwrite its gradients, and checks that refuse bad input before anything
    changes). A test that trains or writes parameters builds its own."""
    import tinn
    return tinn.NetworkWithInputEncoding(2, 3, SMALL_GRID, SMALL_NET)


@contextlib.contextmanager
def on_path(device: bool):
    """Build and run models inside on the device path (``device=True``: ``tinn.runtime.program.FORCE``, on the CPU
    the path a GPU takes, batches on the device) or on the arch's own path (``False``); the path is restored after."""
    from tinn.runtime import program
    before, program.FORCE = program.FORCE, bool(device)
    try:
        yield
    finally:
        program.FORCE = before


@pytest.fixture
def device_path():
    """The test on the device path on any arch (:func:`on_path`)."""
    with on_path(True):
        yield


@pytest.fixture
def set_path():
    """``set_path(device)``: the rest of the test on the device path (``True``) or the arch's own path (``False``);
    restored after the test (:func:`on_path`)."""
    with contextlib.ExitStack() as paths:
        yield lambda device: paths.enter_context(on_path(device))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def one_torch_thread():
    """torch's CPU ops on one thread for the test (restored after). About one process in 20 on a 2-core
    machine, torch's CPU ``sqrt`` computes its second thread's share of a tensor (over 2048 elements) to about
    12 bits (MKL's first-call race, pytorch/pytorch#188792): an Adam step of torch's used as a reference is
    then not the same from run to run."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
