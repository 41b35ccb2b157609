"""Grid kernels on any float input, NaN and +-Inf included (the device path's values are checked on the
device after the kernels ran, so the kernels must be memory-safe for them).

The kernels are called directly on ``ti.ndarray`` batches (bypassing the public value check) in a
subprocess on the forced device path: the process must exit cleanly, finite rows must encode as the
reference does, the parameters must be unchanged, and the gradients (first and second order) of the
rows holding one bad value may be non-zero only on the entries those rows touch under the documented
rule: NaN reads as 0, |x| > 2^64 as +-2^64, and a position beyond the int32 range is clamped to it.
"""
import os
import subprocess
import sys
import textwrap
from itertools import product

import numpy as np

from conftest import spread
from reference import grid_geometry, grid_index

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
CASES = [  # D, type, interpolation, F, base, log2_T
    (2, "Hash", "Linear", 2, 16, 8),            # level 0 fits a block off the CPU, the hashed ones do not
    (3, "Dense", "Smoothstep", 1, 4, 19),
    (1, "Tiled", "Nearest", 4, 5, 19),          # 5 entries: 2^31 (a NaN cast to int32 on x86) is not entry 0
]
RUN = spread(CASES, 1)
"""The cases the subprocess runs: all in the full suite, the first (hashed and dense levels) by default."""
N_LEVELS = 3
BAD = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 3.4e38, -3.4e38, 2.0 ** 40], np.float32)

SCRIPT = """
import sys, numpy as np, taichi as ti
sys.path.insert(0, {tests!r})
ti.init(arch=getattr(ti, {arch!r}), log_level=ti.ERROR, enable_fallback=False)
import tinn
from tinn.runtime import program as _program
from tinn.batch.batch import Batch
from tinn.batch.routing import Routing
import test_grid_nonfinite as t
_program.FORCE = True
for case in t.RUN:
    t.check(tinn, ti, Batch, Routing, case)
print("clean exit")
"""


def nd(ti, a):
    out = ti.ndarray(ti.f32, a.shape)
    out.from_numpy(np.ascontiguousarray(a, np.float32))
    return out


def batch(D, rng):
    """Finite rows from [-0.5, 1.5), then rows with one bad value and rows of bad values only."""
    finite = rng.uniform(-0.5, 1.5, (200, D)).astype(np.float32)
    one_bad = rng.uniform(0, 1, (len(BAD) * D, D)).astype(np.float32)
    for i, (v, d) in enumerate(product(BAD, range(D))):
        one_bad[i, d] = v
    all_bad = np.repeat(BAD[:, None], D, axis=1)
    return np.concatenate([finite, one_bad, all_bad]), len(finite)


def touched(x, levels, F, interpolation, n_params):
    """The parameter entries the rows of x touch under the documented rule."""
    xs = np.where(np.isnan(x), 0, np.clip(x.astype(np.float64), -2.0 ** 64, 2.0 ** 64)).astype(np.float32)
    mask = np.zeros(n_params, bool)
    for level in levels:
        pos = np.clip(np.float32(level.scale) * xs + np.float32(0.5), -2.0 ** 31, 2.0 ** 31 - 128)
        p = np.floor(pos).astype(np.int64)
        corners = [(0,) * x.shape[1]] if interpolation == "Nearest" else product((0, 1), repeat=x.shape[1])
        for c in corners:
            idx = grid_index(p + np.array(c), level)
            mask[(level.offset + idx)[:, None] * F + np.arange(F)] = True
    return mask


def check(tinn, ti, Batch, Routing, case):
    from reference import grid_ref
    D, grid_type, interp, F, base, log2_T = case
    enc = tinn.create_encoding(D, {"otype": "Grid", "type": grid_type, "n_levels": N_LEVELS, "n_features_per_level": F,
                                   "base_resolution": base, "per_level_scale": 2.0, "interpolation": interp,
                                   "log2_hashmap_size": log2_T})
    levels = grid_geometry(D, grid_type, N_LEVELS, log2_T, base, 2.0)
    rng = np.random.default_rng(D)
    theta = rng.uniform(-1, 1, enc.n_params).astype(np.float32)
    enc.set_params(theta)
    x, n_finite = batch(D, rng)
    B, width = x.shape[0], enc.padded_output_width
    xd = nd(ti, x)
    y, ctx = enc._forward(xd, Batch(xd, Routing(B), tinn.batch.batch.DEVICE))     # a device batch: values unchecked
    y = y.to_numpy()
    np.testing.assert_allclose(y[:n_finite, :N_LEVELS * F], grid_ref(x[:n_finite], theta, levels, F, interp),
                               rtol=1e-4, atol=1e-5)
    for v in BAD:                       # the rows holding v add their gradients, the others zeros
        rows = np.any((x == v) | (np.isnan(x) & np.isnan(v)), axis=1)
        allowed = touched(x[rows], levels, F, interp, enc.n_params)
        dy = nd(ti, rng.normal(size=(B, width)) * rows[:, None])
        enc._backward(ctx, dy, True, overwrite=True)
        assert not np.any(enc.gradients()[~allowed] != 0), f"x = {v}: a gradient outside the touched entries"
        enc._backward_backward_input(ctx, nd(ti, rng.normal(size=(B, D))), dy, overwrite=True)
        assert not np.any(enc.gradients()[~allowed] != 0), f"x = {v}: a second-order gradient outside them"
    np.testing.assert_array_equal(enc.params(), theta)


def test_grid_kernels_are_memory_safe_on_any_float_input():
    arch = os.environ.get("TINN_ARCH", "cpu")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT.format(tests=TESTS_DIR, arch=arch))],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["clean", "exit"]
