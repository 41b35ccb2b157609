"""Independent NumPy references of the formulas in ``shared/spec/TCNN_REFERENCE.md``, shared by the tests.

Everything here is written from the spec and evaluated in float64; nothing imports tinn.
One reference per formula: the test modules import from here rather than keep copies.

* helpers: padding, finite differences, tolerant comparisons;
* §1 encodings: one function per formula, and :class:`EncodingRef`, a reference model of a
  whole encoding config (widths, fill values, alignment, parameters, padded output),
  Composite and the NRC preset included;
* §2.2–2.3 activations and the MLP;
* §3.2 losses;
* §5.4 tcnn's pcg32, one draw at a time.
"""
from __future__ import annotations

import math
import re
from collections import namedtuple
from itertools import product

import numpy as np


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def next_multiple(v, k):
    """§0.1: ceil(v / k) · k."""
    return -(-v // k) * k


def padded(y, width, fill):
    """§1.0: the padded output: real values first, then ``fill`` up to ``width`` columns."""
    out = np.full((y.shape[0], width), fill, np.float64)
    out[:, : y.shape[1]] = y
    return out


def fd_gradient(loss, v, h):
    """Central differences, in float64, of the scalar ``loss`` with respect to every entry of ``v``."""
    v = np.array(v, np.float64)
    g = np.zeros_like(v)
    for i in np.ndindex(v.shape):
        e = np.zeros_like(v)
        e[i] = h
        g[i] = (loss(v + e) - loss(v - e)) / (2 * h)
    return g


def fd_input_gradient(f, x, dL_dy, h):
    """Central differences, in float64, of L(x) = Σ_j dL_dy_j · f(x)_j with respect to every input.

    Samples are independent, so one dimension is perturbed for the whole batch at once.
    """
    x = x.astype(np.float64)
    g = np.zeros_like(x)
    for d in range(x.shape[1]):
        e = np.zeros_like(x)
        e[:, d] = h
        g[:, d] = ((f(x + e) - f(x - e)) * dL_dy).sum(1) / (2 * h)
    return g


def second_order_fd(input_grad, x, dL_dy, v, h):
    """tcnn's second order from a first-order backward, in float64: for L2 = <v, dL/dx> with
    ``dL/dx = input_grad(x, dL_dy)`` (one row per sample), returns ``(dL2/d(dL_dy), dL2/dx)``.

    L2 is linear in dL_dy, so its gradient there is exact: column j is <v, input_grad(x, e_j)>. The
    gradient in x is by central differences (samples are independent: one dimension for the whole batch).
    """
    x, v = x.astype(np.float64), v.astype(np.float64)
    d_dy = np.zeros(dL_dy.shape)
    for j in range(dL_dy.shape[1]):
        e = np.zeros(dL_dy.shape)
        e[:, j] = 1.0
        d_dy[:, j] = (v * input_grad(x, e)).sum(1)
    return d_dy, fd_input_gradient(lambda z: input_grad(z, dL_dy), x, v, h)


def assert_within(actual, expected, tol):
    """|actual − expected| ≤ tol elementwise (tol may be an array), with a readable failure message."""
    err = np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))
    tol = np.broadcast_to(tol, err.shape)
    bad = err > tol
    assert not bad.any(), (f"{bad.sum()} of {bad.size} elements exceed the tolerance; worst excess at "
                           f"{np.unravel_index(np.argmax(err - tol), err.shape)}: err {err.max():.3g}, "
                           f"first bad: actual {np.asarray(actual)[bad][:5]}, expected {np.asarray(expected)[bad][:5]}")


def assert_close(actual, expected, rtol, atol_rel=None, atol=0.0):
    """``assert_allclose`` with an absolute floor relative to the largest expected magnitude."""
    expected = np.asarray(expected, np.float64)
    if atol_rel is not None:
        atol = max(atol, atol_rel * float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# §1.1–1.4 per-dimension encodings
# ---------------------------------------------------------------------------------------------

def identity_ref(x, scale, offset):
    """§1.1: y_j = scale · x_j + offset."""
    return scale * x.astype(np.float64) + offset


def identity_grad_ref(dL_dy, scale):
    """§1.1: dL/dx_j = scale · dL/dy_j."""
    return scale * dL_dy.astype(np.float64)


def frequency_ref(x, F):
    """§1.2: y[d·2F + 2f + s] = sin(2^f · π · x_d + s · π/2)."""
    x = x.astype(np.float64)
    y = np.empty((x.shape[0], x.shape[1] * 2 * F))
    for d, f, s in product(range(x.shape[1]), range(F), range(2)):
        y[:, d * 2 * F + 2 * f + s] = np.sin(2.0 ** f * np.pi * x[:, d] + s * np.pi / 2)
    return y


def frequency_grad_ref(x, dL_dy, F):
    """§1.2: dL/dx_d = Σ_{f,s} dL/dy[d,f,s] · 2^f · π · cos(2^f · π · x_d + s · π/2)."""
    x = x.astype(np.float64)
    g = np.zeros(x.shape)
    for d, f, s in product(range(x.shape[1]), range(F), range(2)):
        g[:, d] += dL_dy[:, d * 2 * F + 2 * f + s] * 2.0 ** f * np.pi * np.cos(2.0 ** f * np.pi * x[:, d] + s * np.pi / 2)
    return g


def triangle_wave_ref(x, F):
    """§1.3: v = x_d · 2^(k−1) + 0.25·k, y[d·F + k] = 4 · |v − floor(v) − 0.5| − 1."""
    x = x.astype(np.float64)
    y = np.empty((x.shape[0], x.shape[1] * F))
    for d, k in product(range(x.shape[1]), range(F)):
        v = x[:, d] * 2.0 ** (k - 1) + 0.25 * k
        y[:, d * F + k] = 4 * np.abs(v - np.floor(v) - 0.5) - 1
    return y


def triangle_wave_kink_distance(x, F):
    """Per sample, the smallest distance in x to a kink of any output (where 2v = x·2^k + k/2 is an integer)."""
    x = x.astype(np.float64)
    dist = np.full(x.shape[0], np.inf)
    for d, k in product(range(x.shape[1]), range(F)):
        w = x[:, d] * 2.0 ** k + 0.5 * k
        dist = np.minimum(dist, np.abs(w - np.round(w)) / 2.0 ** k)
    return dist


def oneblob_ref(x, K):
    """§1.4: y[d·K + k] = C((k+1)/K − x_d) − C(k/K − x_d), C(t) = Q(t) + Q(t − 1) + Q(t + 1),
    Q(t) = clamp(15/16 · u · (1 − 2/3 u² + 1/5 u⁴) + 1/2, 0, 1), u = K·t."""
    def Q(t):
        u = K * t
        return np.clip(15 / 16 * u * (1 - 2 / 3 * u ** 2 + u ** 4 / 5) + 0.5, 0.0, 1.0)

    def C(t):
        return Q(t) + Q(t - 1) + Q(t + 1)

    x = x.astype(np.float64)
    y = np.empty((x.shape[0], x.shape[1] * K))
    for d, k in product(range(x.shape[1]), range(K)):
        y[:, d * K + k] = C((k + 1) / K - x[:, d]) - C(k / K - x[:, d])
    return y


# ---------------------------------------------------------------------------------------------
# §1.5 Spherical harmonics: the spec's table of constants and polynomials, parsed
# ---------------------------------------------------------------------------------------------

SH_TABLE = [  # output i: (constant, polynomial in (x, y, z) = 2·input − 1), copied from §1.5
    (0.28209479177387814, "1"),
    (-0.48860251190291992, "y"),
    (0.48860251190291992, "z"),
    (-0.48860251190291992, "x"),
    (1.0925484305920792, "xy"),
    (-1.0925484305920792, "yz"),
    (0.31539156525251999, "3z² - 1"),
    (-1.0925484305920792, "xz"),
    (0.54627421529603959, "x² - y²"),
    (-0.59004358992664352, "3x²y - y³"),
    (2.8906114426405543, "xyz"),
    (-0.45704579946446572, "5yz² - y"),
    (0.3731763325901154, "5z³ - 3z"),
    (-0.45704579946446572, "5xz² - x"),
    (1.4453057213202771, "x²z - y²z"),
    (-0.59004358992664352, "x³ - 3xy²"),
    (2.5033429417967046, "x³y - xy³"),
    (-1.7701307697799304, "3x²yz - y³z"),
    (0.94617469575755997, "7xyz² - xy"),
    (-0.66904654355728921, "7yz³ - 3yz"),
    (0.10578554691520431, "35z⁴ - 30z² + 3"),
    (-0.66904654355728921, "7xz³ - 3xz"),
    (0.47308734787877998, "7x²z² - x² - 7y²z² + y²"),
    (-1.7701307697799304, "x³z - 3xy²z"),
    (0.62583573544917614, "x⁴ - 6x²y² + y⁴"),
    (-0.65638205684017015, "5x⁴y - 10x²y³ + y⁵"),
    (8.3026492595241645, "x³yz - xy³z"),
    (-0.48923829943525038, "27x²yz² - 3x²y - 9y³z² + y³"),
    (4.7935367849733241, "3xyz³ - xyz"),
    (-0.45294665119569694, "21yz⁴ - 14yz² + y"),
    (0.1169503224534236, "63z⁵ - 70z³ + 15z"),
    (-0.45294665119569694, "21xz⁴ - 14xz² + x"),
    (2.3967683924866621, "3x²z³ - x²z - 3y²z³ + y²z"),
    (-0.48923829943525038, "9x³z² - x³ - 27xy²z² + 3xy²"),
    (2.0756623148810411, "x⁴z - 6x²y²z + y⁴z"),
    (-0.65638205684017015, "x⁵ - 10x³y² + 5xy⁴"),
    (1.3663682103838286, "3x⁵y - 10x³y³ + 3xy⁵"),
    (-2.3666191622317521, "5x⁴yz - 10x²y³z + y⁵z"),
    (2.0182596029148967, "11x³yz² - x³y - 11xy³z² + xy³"),
    (-0.92120525951492349, "33x²yz³ - 9x²yz - 11y³z³ + 3y³z"),
    (0.92120525951492349, "33xyz⁴ - 18xyz² + xy"),
    (-0.58262136251873142, "33yz⁵ - 30yz³ + 5yz"),
    (0.063569202267628425, "231z⁶ - 315z⁴ + 105z² - 5"),
    (-0.58262136251873142, "33xz⁵ - 30xz³ + 5xz"),
    (0.46060262975746175, "33x²z⁴ - 18x²z² + x² - 33y²z⁴ + 18y²z² - y²"),
    (-0.92120525951492349, "11x³z³ - 3x³z - 33xy²z³ + 9xy²z"),
    (0.50456490072872417, "11x⁴z² - x⁴ - 66x²y²z² + 6x²y² + 11y⁴z² - y⁴"),
    (-2.3666191622317521, "x⁵z - 10x³y²z + 5xy⁴z"),
    (0.6831841051919143, "x⁶ - 15x⁴y² + 15x²y⁴ - y⁶"),
    (-0.70716273252459616, "7x⁶y - 35x⁴y³ + 21x²y⁵ - y⁷"),
    (5.2919213236038001, "3x⁵yz - 10x³y³z + 3xy⁵z"),
    (-0.51891557872026028, "65x⁴yz² - 5x⁴y - 130x²y³z² + 10x²y³ + 13y⁵z² - y⁵"),
    (4.1513246297620823, "13x³yz³ - 3x³yz - 13xy³z³ + 3xy³z"),
    (-0.15645893386229404, "429x²yz⁴ - 198x²yz² + 9x²y - 143y³z⁴ + 66y³z² - 3y³"),
    (0.44253269244498261, "143xyz⁵ - 110xyz³ + 15xyz"),
    (-0.09033160758251732, "429yz⁶ - 495yz⁴ + 135yz² - 5y"),
    (0.068284276912004949, "429z⁷ - 693z⁵ + 315z³ - 35z"),
    (-0.09033160758251732, "429xz⁶ - 495xz⁴ + 135xz² - 5x"),
    (0.22126634622249131, "143x²z⁵ - 110x²z³ + 15x²z - 143y²z⁵ + 110y²z³ - 15y²z"),
    (-0.15645893386229404, "143x³z⁴ - 66x³z² + 3x³ - 429xy²z⁴ + 198xy²z² - 9xy²"),
    (1.0378311574405206, "13x⁴z³ - 3x⁴z - 78x²y²z³ + 18x²y²z + 13y⁴z³ - 3y⁴z"),
    (-0.51891557872026028, "13x⁵z² - x⁵ - 130x³y²z² + 10x³y² + 65xy⁴z² - 5xy⁴"),
    (2.6459606618019, "x⁶z - 15x⁴y²z + 15x²y⁴z - y⁶z"),
    (-0.70716273252459616, "x⁷ - 21x⁵y² + 35x³y⁴ - 7xy⁶"),
]

_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")


def parse_polynomial(text):
    """'7x²z² - x² + 3' → [(7, (2, 0, 2)), (-1, (2, 0, 0)), (3, (0, 0, 0))],
    as (coefficient, exponents of x, y, z)."""
    terms = []
    for sign, body in re.findall(r"([+-]?)([^+-]+)", text.replace(" ", "")):
        coefficient, monomial = re.fullmatch(r"(\d*)([xyz⁰¹²³⁴⁵⁶⁷⁸⁹]*)", body).groups()
        exps = [0, 0, 0]
        for var, power in re.findall(r"([xyz])([⁰¹²³⁴⁵⁶⁷⁸⁹]*)", monomial):
            exps["xyz".index(var)] += int(power.translate(_SUPERSCRIPTS)) if power else 1
        c = int(coefficient) if coefficient else 1
        terms.append((-c if sign == "-" else c, tuple(exps)))
    return terms


def sh_ref(x, degree):
    """§1.5: Y_i(2·input − 1) = constant_i · polynomial_i for i < degree², from the table (not renormalised)."""
    v = 2 * x.astype(np.float64) - 1
    y = np.zeros((x.shape[0], degree * degree))
    for i in range(degree * degree):
        constant, poly = SH_TABLE[i]
        for c, (a, b, e) in parse_polynomial(poly):
            y[:, i] += constant * c * v[:, 0] ** a * v[:, 1] ** b * v[:, 2] ** e
    return y


# ---------------------------------------------------------------------------------------------
# §1.6 Grid encodings
# ---------------------------------------------------------------------------------------------

Level = namedtuple("Level", "scale res entries offset hashed")

PRIMES = (1, 2654435761, 805459861, 3674653429, 2097192037, 1434869437, 2165219737)
MAX_BASE = {1: 0xFFFFFFFF, 2: 0xFFFF, 3: 0x659, 4: 0xFF}   # D = 1 is a tinn extension (spec §8 A12)


def grid_geometry(D, grid_type, n_levels, log2_hashmap_size=19, base_resolution=16, per_level_scale=2.0):
    """§1.6.2–1.6.4: per level the float32 scale, resolution, entries, entry offset and hashed-or-dense.

    scale_l = exp2(l · log2 b) · N_min − 1 (float32), res_l = ceil(scale_l) + 1,
    entries_l = next_multiple(res_l^D, 8), capped at 2^log2_hashmap_size (Hash) or N_min^D (Tiled);
    a Hash level is hashed only when its table is smaller than res_l^D.
    """
    f32 = np.float32
    log2b = f32(math.log2(float(f32(per_level_scale))))        # correctly rounded float32 (float64 math)
    levels, offset = [], 0
    for l in range(n_levels):
        scale = f32(f32(2.0 ** float(f32(f32(l) * log2b))) * f32(base_resolution)) - f32(1)
        res = int(np.ceil(np.float64(scale))) + 1
        entries = next_multiple(min(res ** D, (2 ** 32 - 1) // 2), 8)
        if grid_type == "Tiled":
            entries = min(entries, base_resolution ** D)
        elif grid_type == "Hash":
            entries = min(entries, 2 ** log2_hashmap_size)
        stride = res ** D if res <= MAX_BASE[D] else 0xFFFFFFFF
        levels.append(Level(scale, res, entries, offset, grid_type == "Hash" and entries < stride))
        offset += entries
    return levels


def coherent_prime_hash(p):
    """§1.6.4: hash(p) = XOR_d (p_d · π_d mod 2^32)."""
    p = np.asarray(p, np.uint64)
    h = np.zeros(p.shape[:-1], np.uint64)
    for d in range(p.shape[-1]):
        h ^= (p[..., d] * np.uint64(PRIMES[d])) & np.uint64(0xFFFFFFFF)
    return h


def grid_index(p, level):
    """§1.6.4: entry of integer position p at a level: dense Σ_d p_d·res^d (uint32) or the hash, mod entries.

    p may be negative (an int32 position cast to uint32 wraps: p mod 2^32); all arithmetic is mod 2^32.
    """
    p = (np.asarray(p, np.int64) & 0xFFFFFFFF).astype(np.uint64)
    if level.hashed:
        idx = coherent_prime_hash(p)
    else:
        idx = np.zeros(p.shape[:-1], np.uint64)
        for d in range(p.shape[-1]):
            idx = (idx + p[..., d] * np.uint64(level.res ** d)) & np.uint64(0xFFFFFFFF)
    return (idx % np.uint64(level.entries)).astype(np.int64)


def grid_corner_terms(x, level, interpolation, exact=False):
    """§1.6.5–1.6.6 at one level: (entry index, weight, d weight / dx) of each interpolation corner, per sample.

    pos = scale·x + 0.5, p = floor(pos), t = pos − p; w = t (Linear) or t²(3 − 2t) (Smoothstep);
    a corner c weighs Π_d (c_d ? w_d : 1 − w_d), and its derivative along d is
    ±scale·w'_d · Π_{d'≠d}(c_d' ? w_d' : 1 − w_d') (+ for the upper corner c_d = 1), shape (B, D);
    w' = 1 (Linear), 6t(1 − t) (Smoothstep). Nearest uses the lower corner with weight 1 and slope 0.
    ``exact=False`` forms pos in float32 as tcnn does; ``exact=True`` in float64 (for finite differences).
    p = floor(pos) is an int32 cast to uint32 (§1.6.5), so x may lie anywhere where pos fits in int32.
    """
    if exact:
        pos = np.float64(level.scale) * x.astype(np.float64) + 0.5
    else:
        pos = level.scale * x.astype(np.float32) + np.float32(0.5)
    p = np.floor(pos)
    assert ((p >= -2 ** 31) & (p <= 2 ** 31 - 1)).all(), "tcnn's formula is defined where floor(scale·x + 0.5) fits in int32"
    t = (pos - p).astype(np.float64)
    p = p.astype(np.int64)
    B, D = x.shape
    if interpolation == "Nearest":
        return [(grid_index(p, level), np.ones(B), np.zeros((B, D)))]
    if interpolation == "Smoothstep":
        w, dw = t * t * (3 - 2 * t), 6 * t * (1 - t)
    else:
        w, dw = t, np.ones_like(t)
    out = []
    for c in product((0, 1), repeat=D):
        factors = [w[:, d] if c[d] else 1 - w[:, d] for d in range(D)]
        slope = np.stack([(1 if c[d] else -1) * np.float64(level.scale) * dw[:, d]
                          * np.prod([factors[e] for e in range(D) if e != d], axis=0) for d in range(D)], axis=1)
        out.append((grid_index(p + np.array(c), level), np.prod(factors, axis=0), slope))
    return out


def grid_corners(x, level, interpolation, exact=False):
    """§1.6.5 at one level: (entry index, weight) of each interpolation corner, per sample."""
    return [(idx, weight) for idx, weight, _ in grid_corner_terms(x, level, interpolation, exact)]


def grid_ref(x, params, levels, F, interpolation, exact=False):
    """§1.6.5: y_{l,f} = Σ_c weight_c · θ[(offset_l + index(p + c)) · F + f], output index l·F + f."""
    theta = params.astype(np.float64)
    y = np.zeros((x.shape[0], len(levels) * F))
    for l, level in enumerate(levels):
        for idx, weight in grid_corners(x, level, interpolation, exact):
            y[:, l * F:(l + 1) * F] += weight[:, None] * theta[(level.offset + idx)[:, None] * F + np.arange(F)]
    return y


def grid_param_grad_ref(x, dL_dy, levels, F, interpolation, n_params):
    """§1.6.6: dL/dθ[(offset_l + index(p + c))·F + f] += weight_c · dL/dy_{l,f}, summed over the batch."""
    g = np.zeros(n_params)
    for l, level in enumerate(levels):
        for idx, weight in grid_corners(x, level, interpolation):
            np.add.at(g, (level.offset + idx)[:, None] * F + np.arange(F),
                      weight[:, None] * dL_dy[:, l * F:(l + 1) * F].astype(np.float64))
    return g


def grid_jacobian_ref(x, params, levels, F, interpolation, exact=False):
    """§1.6.6: dy_{l,f}/dx_d = Σ_c (d weight_c / dx_d) · θ[(offset_l + index(p + c)) · F + f], shape (B, L·F, D)."""
    theta = params.astype(np.float64)
    J = np.zeros((x.shape[0], len(levels) * F, x.shape[1]))
    for l, level in enumerate(levels):
        for idx, _, slope in grid_corner_terms(x, level, interpolation, exact):
            J[:, l * F:(l + 1) * F] += slope[:, None, :] * theta[(level.offset + idx)[:, None] * F + np.arange(F)][..., None]
    return J


def grid_input_grad_ref(x, params, dL_dy, levels, F, interpolation, exact=False):
    """§1.6.6: dL/dx_d = Σ_{l,f} dL/dy_{l,f} · dy_{l,f}/dx_d."""
    J = grid_jacobian_ref(x, params, levels, F, interpolation, exact)
    return np.einsum("bj,bjd->bd", dL_dy[:, :J.shape[1]].astype(np.float64), J)


def grid_second_order_param_grad_ref(x, G, dL_dy, levels, F, interpolation, n_params, exact=False):
    """§1.6.6: for L2 = Σ_b <G_b, dL/dx_b>, dL2/dθ[(offset_l + index(p + c))·F + f] += Σ_d G_d · (d weight_c / dx_d)
    · dL/dy_{l,f} (L2 is linear in θ: the upper corner along d gets +, the lower one −)."""
    g = np.zeros(n_params)
    for l, level in enumerate(levels):
        for idx, _, slope in grid_corner_terms(x, level, interpolation, exact):
            coeff = (slope * G.astype(np.float64)).sum(1)
            np.add.at(g, (level.offset + idx)[:, None] * F + np.arange(F),
                      coeff[:, None] * dL_dy[:, l * F:(l + 1) * F].astype(np.float64))
    return g


def grid_off_boundaries(x, levels, margin):
    """Per sample: every level's cell fraction t stays ≥ ``margin`` from 0 and 1 (the grid gradient jumps there)."""
    ok = np.ones(len(x), bool)
    for level in levels:
        t = np.float64(level.scale) * x.astype(np.float64) + 0.5
        t -= np.floor(t)
        ok &= ((t > margin) & (t < 1 - margin)).all(1)
    return ok


def interior_points(rng, n, D, levels, margin=0.01):
    """Uniform x in [0,1)^D with every level's cell fraction t at least ``margin`` from 0 and 1.

    The grid's input gradient and the Nearest output jump at cell boundaries, so finite
    differences (and float32-vs-float64 floor) are only meaningful away from them.
    """
    pts = []
    while sum(len(p) for p in pts) < n:
        x = rng.random((4 * n, D)).astype(np.float32)
        pts.append(x[grid_off_boundaries(x, levels, margin)])
    return np.concatenate(pts)[:n]


# ---------------------------------------------------------------------------------------------
# The permutohedral encoding (PermutoSDF; tinn's docs/encodings.md)
# ---------------------------------------------------------------------------------------------

PERMUTO_PRIMES = PRIMES + (2246822519,)        # xxHash's PRIME32_2 for an eighth dim


def permuto_geometry(L, log2_hashmap_size, base_resolution, per_level_scale):
    """Per level: scale_l = exp2(l log2 b) N_min (float32) and a hashed table of 2^log2_hashmap_size entries."""
    f32, T = np.float32, 2 ** log2_hashmap_size
    return [Level(f32(f32(np.exp2(f32(l) * f32(np.log2(f32(per_level_scale))))) * f32(base_resolution)), 0, T, l * T,
                  True) for l in range(L)]


def permuto_embedding(D):
    """(D + 1) x D matrix E with e = scale E x on the hyperplane sum(e) = 0: e_i = Σ_{j≥i} c_j − i c_{i−1},
    c_j = x_j / sqrt((j + 1)(j + 2))."""
    E = np.zeros((D + 1, D))
    for j in range(D):
        c = 1 / np.sqrt((j + 1) * (j + 2))
        E[:j + 1, j] += c
        E[j + 1, j] -= (j + 1) * c
    return E


def permuto_vertices(x, level):
    """(keys (B, D + 1, D + 1), barycentric weights (B, D + 1)) of the simplex of A*_D enclosing each point.

    The remainder-0 point r0 nearest per coordinate (multiples of D + 1), the ranks of e − r0 (largest first)
    shifted by Σ r0 / (D + 1) and wrapped into 0..D; vertex r = r0 + r − (D + 1)[rank > D − r]. The weights are
    not taken from a formula: they solve Σ_r w_r v_r = e, Σ_r w_r = 1, and must come out ≥ 0 (e inside).
    """
    B, D = x.shape
    n = D + 1
    e = np.float64(level.scale) * x.astype(np.float64) @ permuto_embedding(D).T
    r0 = np.round(e / n) * n
    rank = np.empty((B, n), np.int64)
    order = np.argsort(-(e - r0), axis=1, kind="stable")
    np.put_along_axis(rank, order, np.arange(n)[None, :].repeat(B, 0), axis=1)
    rank += (r0.sum(1) / n).round().astype(np.int64)[:, None]
    r0 = r0 + n * (rank < 0) - n * (rank > D)
    rank = rank % n
    keys = np.stack([r0 + r - n * (rank > D - r) for r in range(n)], axis=1)      # (B, vertex, coordinate)
    A = np.concatenate([keys.transpose(0, 2, 1), np.ones((B, 1, n))], axis=1)    # (B, D + 2, D + 1)
    rhs = np.concatenate([e, np.ones((B, 1))], axis=1)
    w = np.stack([np.linalg.lstsq(A[b], rhs[b], rcond=None)[0] for b in range(B)])
    assert np.allclose(np.einsum("brc,br->bc", keys, w), e, atol=1e-6 * (1 + np.abs(e).max()))
    assert (w > -1e-9).all(), "the simplex found does not enclose the point"
    return keys.astype(np.int64), w


def permuto_terms(x, level):
    """Per vertex r: (entry index, weight) per sample; the entry hashes the first D key coordinates."""
    keys, w = permuto_vertices(x, level)
    D = x.shape[1]
    out = []
    for r in range(D + 1):
        p = (keys[:, r, :D] & 0xFFFFFFFF).astype(np.uint64)
        h = np.zeros(len(x), np.uint64)
        for d in range(D):
            h ^= (p[:, d] * np.uint64(PERMUTO_PRIMES[d])) & np.uint64(0xFFFFFFFF)
        out.append(((h % np.uint64(level.entries)).astype(np.int64), w[:, r]))
    return out


def permuto_ref(x, params, levels, F):
    """y_{l,f} = Σ_r w_r θ[(offset_l + index(v_r)) F + f]."""
    theta = params.astype(np.float64)
    y = np.zeros((x.shape[0], len(levels) * F))
    for l, level in enumerate(levels):
        for idx, w in permuto_terms(x, level):
            y[:, l * F:(l + 1) * F] += w[:, None] * theta[(level.offset + idx)[:, None] * F + np.arange(F)]
    return y


def permuto_param_grad_ref(x, dL_dy, levels, F, n_params):
    """dL/dθ[(offset_l + index(v_r)) F + f] += w_r dL/dy_{l,f}, summed over the batch."""
    g = np.zeros(n_params)
    for l, level in enumerate(levels):
        for idx, w in permuto_terms(x, level):
            np.add.at(g, (level.offset + idx)[:, None] * F + np.arange(F), w[:, None] * dL_dy[:, l * F:(l + 1) * F])
    return g


def permuto_off_boundaries(x, levels, margin):
    """Per sample: every level's barycentric weights are ≥ margin (the input gradient jumps between simplices)."""
    ok = np.ones(len(x), bool)
    for level in levels:
        ok &= permuto_vertices(x, level)[1].min(1) >= margin
    return ok


# ---------------------------------------------------------------------------------------------
# §1.0 / §1.7: a reference model of any encoding config, Composite and NRC included
# ---------------------------------------------------------------------------------------------

def _lower(cfg):
    return cfg.get("otype", "OneBlob").lower()


class EncodingRef:
    """The reference of one encoding config on ``n_in`` inputs (spec §1).

    ``raw`` is the unpadded width, ``fill`` the padding value, ``align`` the
    ``required_output_alignment``, ``n_params`` the parameter count. ``forward(x, θ, width)``
    returns the output padded to ``width`` columns; ``param_grad`` the parameter gradient for a
    ``(B, width)`` output gradient; ``smooth(x)`` marks samples where the output is smooth
    enough for finite differences (away from grid cells' and triangle waves' kinks).
    """

    def __new__(cls, n_in, cfg):
        if cls is EncodingRef and _lower(cfg) in ("composite", "nrc", "oneblobfrequency"):
            return super().__new__(CompositeRef)
        return super().__new__(cls)

    def __init__(self, n_in, cfg):
        self.n_in, self.cfg, self.kind = n_in, cfg, _lower(cfg)
        self.fill, self.align, self.n_params = 1.0, 1, 0
        k = self.kind
        if k == "identity":
            self.raw = n_in
        elif k == "frequency":
            self.raw = 2 * cfg.get("n_frequencies", 12) * n_in
        elif k == "trianglewave":
            self.raw = cfg.get("n_frequencies", 12) * n_in
        elif k == "oneblob":
            self.raw = cfg.get("n_bins", 16) * n_in
        elif k == "sphericalharmonics":
            assert n_in == 3
            self.raw = cfg.get("degree", 4) ** 2
        elif k == "empty":
            self.raw = 0
        elif k in ("grid", "hashgrid", "densegrid", "tiledgrid"):
            self.type = cfg.get("type", {"densegrid": "Dense", "tiledgrid": "Tiled"}.get(k, "Hash")).capitalize()
            L, self.F = cfg.get("n_levels", 16), cfg.get("n_features_per_level", 2)
            base = cfg.get("base_resolution", 16)
            b = cfg.get("per_level_scale", math.exp(math.log(256 / base) / (L - 1)) if self.type == "Dense" else 2.0)
            self.interpolation = cfg.get("interpolation", "Linear").capitalize()
            self.levels = grid_geometry(n_in, self.type, L, cfg.get("log2_hashmap_size", 19), base, b)
            self.raw, self.fill, self.align = L * self.F, 0.0, self.F
            self.n_params = self.F * sum(level.entries for level in self.levels)
        elif k == "permutohedral":
            L, self.F = cfg.get("n_levels", 16), cfg.get("n_features_per_level", 2)
            self.levels = permuto_geometry(L, cfg.get("log2_hashmap_size", 19), cfg.get("base_resolution", 16),
                                           cfg.get("per_level_scale", 2.0))
            self.raw, self.fill, self.align = L * self.F, 0.0, self.F
            self.n_params = self.F * sum(level.entries for level in self.levels)
        else:
            raise KeyError(f"no reference for encoding otype {cfg.get('otype')!r}")

    def padded_width(self, alignment):
        """§1.0 ``set_alignment``: next_multiple(width, lcm(alignment, required_output_alignment))."""
        return next_multiple(self.raw, math.lcm(alignment, self.align)) if alignment else self.raw

    def raw_forward(self, x, theta, exact=False):
        k, c = self.kind, self.cfg
        if k == "identity":
            return identity_ref(x, c.get("scale", 1.0), c.get("offset", 0.0))
        if k == "frequency":
            return frequency_ref(x, c.get("n_frequencies", 12))
        if k == "trianglewave":
            return triangle_wave_ref(x, c.get("n_frequencies", 12))
        if k == "oneblob":
            return oneblob_ref(x, c.get("n_bins", 16))
        if k == "sphericalharmonics":
            return sh_ref(x, c.get("degree", 4))
        if k == "empty":
            return np.zeros((x.shape[0], 0))
        if k == "permutohedral":
            return permuto_ref(x, theta, self.levels, self.F)
        return grid_ref(x, theta, self.levels, self.F, self.interpolation, exact)

    def forward(self, x, theta, width, exact=False):
        return padded(self.raw_forward(x, theta, exact), width, self.fill)

    def float32_error(self, x, width):
        """Per output column, a bound on the error of a float32 evaluation beyond rounding of the value.

        Frequency and TriangleWave form a phase 2^f·π·x (resp. x·2^(k−1) + k/4) whose float32 rounding
        (4 half-ulps, relative 2^−22) is amplified by the slope; at F = 12 it reaches ~1e−4.
        """
        k, mag = self.kind, float(np.abs(x).max(initial=1.0))
        err = np.zeros(width)
        if k == "frequency":
            F = self.cfg.get("n_frequencies", 12)
            cols = [2.0 ** f * np.pi * mag + s * np.pi / 2 for f in range(F) for s in range(2)]
            err[:self.raw] = np.tile(cols, self.n_in) * 2.0 ** -22
        elif k == "trianglewave":
            F = self.cfg.get("n_frequencies", 12)
            err[:self.raw] = np.tile([4 * (2.0 ** (j - 1) * mag + 0.25 * j) * 2.0 ** -22 for j in range(F)], self.n_in)
        return err

    def param_grad(self, x, theta, dL_dy):
        if not self.n_params:
            return np.zeros(0)
        if self.kind == "permutohedral":
            return permuto_param_grad_ref(x, dL_dy[:, :self.raw], self.levels, self.F, self.n_params)
        return grid_param_grad_ref(x, dL_dy[:, :self.raw], self.levels, self.F, self.interpolation, self.n_params)

    def smooth(self, x, margin=0.01):
        """Samples whose grid cell fractions are ≥ margin from 0 and 1 and that are ≥ 10⁻⁵ from a triangle kink
        (finite differences use h ≤ 10⁻⁶)."""
        if self.kind == "trianglewave":
            return triangle_wave_kink_distance(x, self.cfg.get("n_frequencies", 12)) > 1e-5
        if self.kind == "permutohedral":
            return permuto_off_boundaries(x, self.levels, margin)
        if self.n_params:
            return grid_off_boundaries(x, self.levels, margin)
        return np.ones(x.shape[0], bool)


class CompositeRef(EncodingRef):
    """§1.7: nested references on input slices; Concatenation pads between them, Sum/Product reduce."""

    def __init__(self, n_in, cfg):
        self.n_in, self.cfg, self.kind = n_in, cfg, "composite"
        if _lower(cfg) != "composite":                    # the NRC / OneBlobFrequency preset
            cfg = {"otype": "Composite", "nested": [
                {"n_dims_to_encode": 3, "otype": "TriangleWave", "n_frequencies": cfg.get("n_frequencies", 12)},
                {"n_dims_to_encode": 5, "otype": "OneBlob", "n_bins": cfg.get("n_bins", 4)},
                {"otype": "Identity"}]}
        self.reduction = cfg.get("reduction", "Concatenation").capitalize()
        nested = cfg["nested"]
        if any("dims_to_encode_begin" in c for c in nested):
            rest = None
        else:
            rest = n_in - sum(c.get("n_dims_to_encode", 0) for c in nested)
        self.parts, offset = [], 0                       # (begin, n, reference)
        for c in nested:
            n = c.get("n_dims_to_encode", rest)
            offset = c.get("dims_to_encode_begin", offset)
            if n > 0:
                own = {k: v for k, v in c.items() if k not in ("n_dims_to_encode", "dims_to_encode_begin")}
                self.parts.append((offset, n, EncodingRef(n, own)))
            offset += n
        refs = [r for _, _, r in self.parts]
        self.n_params = sum(r.n_params for r in refs)
        self.align = math.lcm(*(r.align for r in refs))
        if self.reduction == "Concatenation":   # width_i = next_multiple(start_i + raw_i, align_{i+1}) − start_i
            self.widths, start = [], 0
            for r, following in zip(refs[:-1], refs[1:]):
                self.widths.append(next_multiple(start + r.raw, following.align) - start)
                start += self.widths[-1]
            self.widths.append(refs[-1].raw)
            self.raw = sum(self.widths)
        else:
            widths = {next_multiple(r.raw, self.align) for r in refs}
            assert len(widths) == 1
            self.raw = widths.pop()

    def _split(self, x, theta, width):
        """Per part: (input slice, parameter slice, output width)."""
        out, p = [], 0
        for i, (begin, n, r) in enumerate(self.parts):
            if self.reduction == "Concatenation":
                w = self.widths[i] if i < len(self.parts) - 1 else width - sum(self.widths[:-1])
            else:
                w = width
            out.append((x[:, begin:begin + n], theta[p:p + r.n_params], w))
            p += r.n_params
        return out

    def forward(self, x, theta, width, exact=False):
        outs = [r.forward(xi, ti, w, exact) for (xi, ti, w), (_, _, r) in zip(self._split(x, theta, width), self.parts)]
        if self.reduction == "Concatenation":
            return np.concatenate(outs, axis=1)
        return np.sum(outs, axis=0) if self.reduction == "Sum" else np.prod(outs, axis=0)

    def float32_error(self, x, width):
        errs = [r.float32_error(xi, w) for (xi, _, w), (_, _, r) in zip(self._split(x, np.zeros(self.n_params), width),
                                                                       self.parts)]
        if self.reduction == "Concatenation":
            return np.concatenate(errs)
        return np.sum(errs, axis=0)                     # Product: every factor is bounded by 1 in magnitude here

    def param_grad(self, x, theta, dL_dy):
        width = dL_dy.shape[1]
        split = self._split(x, theta, width)
        outs = [r.forward(xi, ti, w) for (xi, ti, w), (_, _, r) in zip(split, self.parts)]
        grads, col = [], 0
        for k, ((xi, ti, w), (_, _, r)) in enumerate(zip(split, self.parts)):
            if self.reduction == "Concatenation":
                g = dL_dy[:, col:col + w]
                col += w
            elif self.reduction == "Sum":
                g = dL_dy
            else:                                       # Product: dL/dy · Π_{j≠k} y_j
                g = dL_dy * np.prod([o for j, o in enumerate(outs) if j != k], axis=0)
            grads.append(r.param_grad(xi, ti, g))
        return np.concatenate(grads)

    def smooth(self, x, margin=0.01):
        ok = np.ones(x.shape[0], bool)
        for begin, n, r in self.parts:
            ok &= r.smooth(x[:, begin:begin + n], margin)
        return ok


def smooth_points(ref, rng, n, lo=0.0, hi=1.0):
    """n samples uniform in [lo, hi)^n_in where ``ref`` is smooth (for finite differences), float32."""
    pts = []
    while sum(len(p) for p in pts) < n:
        x = rng.uniform(lo, hi, (4 * n, ref.n_in)).astype(np.float32)
        pts.append(x[ref.smooth(x)])
    return np.concatenate(pts)[:n]


# ---------------------------------------------------------------------------------------------
# §2.3 Activations
# ---------------------------------------------------------------------------------------------

K_ACT = 10.0
ACTIVATIONS = ("None", "ReLU", "LeakyReLU", "SiLU", "Exponential", "Sine", "Sigmoid", "Squareplus", "Softplus", "Tanh")


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def act_ref(name, z):
    """§2.3 forward y(z); Softplus and Squareplus are rescaled by K_ACT = 10."""
    if name == "None":
        return z
    if name == "ReLU":
        return np.maximum(z, 0.0)
    if name == "LeakyReLU":
        return np.where(z > 0, z, 0.01 * z)
    if name == "SiLU":
        return z * sigmoid(z)
    if name == "Exponential":
        return np.exp(z)
    if name == "Sine":
        return np.sin(z)
    if name == "Sigmoid":
        return sigmoid(z)
    if name == "Squareplus":
        X = K_ACT * z
        return 0.5 * (X + np.sqrt(X * X + 4.0)) / K_ACT
    if name == "Softplus":
        return np.logaddexp(0.0, K_ACT * z) / K_ACT          # ln(1 + e^(10z)) / 10 without overflow
    if name == "Tanh":
        return np.tanh(z)
    raise ValueError(f"no reference for activation {name!r}")


def act_grad_ref(name, z):
    """§2.3 derivative from the pre-activation z (the true derivative, also for output Sine/SiLU: §8 A7)."""
    if name == "None":
        return np.ones_like(z)
    if name == "ReLU":
        return (z > 0).astype(np.float64)
    if name == "LeakyReLU":
        return np.where(z > 0, 1.0, 0.01)
    if name == "SiLU":
        s = sigmoid(z)
        return s + z * s * (1 - s)
    if name == "Exponential":
        return np.exp(z)
    if name == "Sine":
        return np.cos(z)
    if name == "Sigmoid":
        return sigmoid(z) * (1 - sigmoid(z))
    if name == "Squareplus":
        X = K_ACT * z
        return 0.5 * (1 + X / np.sqrt(X * X + 4.0))
    if name == "Softplus":
        return sigmoid(K_ACT * z)                              # e^(10z) / (e^(10z) + 1)
    if name == "Tanh":
        return 1 - np.tanh(z) ** 2
    raise ValueError(f"no reference for activation {name!r}")


def act_second_ref(name, z):
    """The second derivative act''(z), differentiated by hand from §2.3's act'(z) column."""
    s = sigmoid(z)
    if name in ("None", "ReLU", "LeakyReLU"):
        return np.zeros_like(z)
    if name == "SiLU":                                         # (s + z s (1 − s))' = 2 s' + z s''
        return 2 * s * (1 - s) + z * s * (1 - s) * (1 - 2 * s)
    if name == "Exponential":
        return np.exp(z)
    if name == "Sine":
        return -np.sin(z)
    if name == "Sigmoid":
        return s * (1 - s) * (1 - 2 * s)
    if name == "Squareplus":                                   # (½ (1 + X / √(X² + 4)))', X = 10 z
        X = K_ACT * z
        return 0.5 * K_ACT * 4.0 / (X * X + 4.0) ** 1.5
    if name == "Softplus":
        return K_ACT * sigmoid(K_ACT * z) * (1 - sigmoid(K_ACT * z))
    if name == "Tanh":
        return -2 * np.tanh(z) * (1 - np.tanh(z) ** 2)
    raise ValueError(f"no reference for activation {name!r}")


def act_grad_from_output_ref(name, y):
    """§2.3 third column: the derivative written in terms of the output y (None where tcnn has none)."""
    return {
        "None": lambda: np.ones_like(y),
        "ReLU": lambda: (y > 0).astype(np.float64),
        "LeakyReLU": lambda: np.where(y > 0, 1.0, 0.01),
        "Exponential": lambda: y,
        "Sigmoid": lambda: y * (1 - y),
        "Squareplus": lambda: (K_ACT * y) ** 2 / ((K_ACT * y) ** 2 + 1),
        "Softplus": lambda: 1 - np.exp(-K_ACT * y),
        "Tanh": lambda: 1 - y ** 2,
    }.get(name, lambda: None)()


# ---------------------------------------------------------------------------------------------
# §2.2 MLP
# ---------------------------------------------------------------------------------------------

def mlp_shapes(n_in, n_neurons, n_hidden_layers, n_out):
    """§2.2: W_0 H×n_in, NL−1 matrices H×H, W_NL P×H with P = next_multiple(n_out, 16); NL = 0: one P×n_in."""
    P = next_multiple(n_out, 16)
    if n_hidden_layers == 0:
        return [(P, n_in)]
    return [(n_neurons, n_in)] + [(n_neurons, n_neurons)] * (n_hidden_layers - 1) + [(P, n_neurons)]


def mlp_unflatten(params, shapes):
    """§2.2 layout: the matrices in order, each row-major (W[r][c] at offset + r·cols + c)."""
    Ws, off = [], 0
    for r, c in shapes:
        Ws.append(np.asarray(params[off:off + r * c], np.float64).reshape(r, c))
        off += r * c
    assert off == len(params)
    return Ws


def mlp_forward_ref(x, Ws, act, out_act, kept=None):
    """§2.2: h_0 = x, h_k = act(W_{k−1} h_{k−1}), y = out_act(W_NL h_NL) (padded width P). Returns y, zs, hs.

    ``kept`` (e.g. rounding to float16, as a half-precision model keeps its activations) is applied to every
    hidden output h_k (k = 1..NL, before the next layer reads it) and to every pre-activation kept for the
    backward (zs); the output y is not rounded."""
    keep = kept or (lambda a: a)
    h = x.astype(np.float64)
    zs, hs = [], [h]
    for i, W in enumerate(Ws):
        z = h @ W.T
        last = i == len(Ws) - 1
        h = act_ref(out_act if last else act, z)
        h = h if last else keep(h)
        zs.append(keep(z))
        hs.append(h)
    return h, zs, hs


def mlp_backward_ref(Ws, zs, hs, dL_dy, act, out_act):
    """§2.2: δ = out_act'(z) ⊙ dL/dy; dL/dW_k = δ_{k+1}ᵀ h_k (summed over the batch);
    δ_k = act'(z_k) ⊙ δ_{k+1} W_k.

    ``dL_dy`` has the padded width P (zero on the padded rows). Returns ([dL/dW_k], dL/dx).
    """
    g = dL_dy.astype(np.float64)
    dWs = [None] * len(Ws)
    for i in reversed(range(len(Ws))):
        g = g * act_grad_ref(out_act if i == len(Ws) - 1 else act, zs[i])
        dWs[i] = g.T @ hs[i]
        g = g @ Ws[i]
    return dWs, g


def mlp_second_order_ref(x, flat_params, shapes, dL_dy, v, act, out_act, n_out):
    """(dL2/d(dL_dy), dL2/dx, dL2/dparams) of one network by finite differences of the reference backward."""
    P = shapes[-1][0]

    def input_grad(params, z, dy):
        Ws = mlp_unflatten(params, shapes)
        _, zs, hs = mlp_forward_ref(z, Ws, act, out_act)
        return mlp_backward_ref(Ws, zs, hs, padded(dy, P, 0.0), act, out_act)[1]

    params = flat_params.astype(np.float64)
    d_dy, d_x = second_order_fd(lambda z, dy: input_grad(params, z, dy), x, dL_dy, v, 1e-6)
    d_params = fd_gradient(lambda p: (v * input_grad(p, x.astype(np.float64), dL_dy)).sum(), params, 1e-6)
    return d_dy, d_x, d_params


def random_weights(shapes, rng, gain=1.0):
    """Xavier-scaled random matrices (flat, float32) for set_params."""
    return np.concatenate([rng.uniform(-1, 1, r * c) * gain * np.sqrt(6 / (r + c)) for r, c in shapes]
                          ).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# §3.2 Losses
# ---------------------------------------------------------------------------------------------

LOSS_EPS = 0.01


def luminance_ref(p):
    """§3.2 RelativeL2Luminance: 0.299 r + 0.587 g + 0.114 b of (p_0, p_1, p_2),
    or of (p_0 + p_3, p_1 + p_4, p_2 + p_5) if D ≥ 6."""
    rgb = p[:, 0:3] + (p[:, 3:6] if p.shape[1] >= 6 else 0.0)
    return 0.299 * rgb[:, 0] + 0.587 * rgb[:, 1] + 0.114 * rgb[:, 2]


def loss_ref(otype, p, t, q):
    """§3.2 per element (value, gradient before loss_scale), both divided by q·N, N = B·D; p is (B, D)."""
    p, t, q = (np.asarray(a, np.float64) for a in (p, t, q))
    n = t.size
    d = p - t
    sign = np.where(d >= 0, 1.0, -1.0)                     # copysign: +0 gives +1
    if otype == "L2":
        value, grad = d ** 2, 2 * d
    elif otype == "L1":
        value, grad = np.abs(d), sign
    elif otype == "RelativeL2":
        denom = p ** 2 + LOSS_EPS
        value, grad = d ** 2 / denom, 2 * d / denom
    elif otype == "RelativeL1":
        denom = np.abs(p) + LOSS_EPS
        value, grad = np.abs(d) / denom, sign / denom
    elif otype == "Mape":
        denom = np.abs(t) + LOSS_EPS
        value, grad = np.abs(d) / denom, sign / denom
    elif otype == "Smape":
        denom = 0.5 * (np.abs(t) + np.abs(p)) + LOSS_EPS
        value, grad = np.abs(d) / denom, sign / denom
    elif otype == "RelativeL2Luminance":
        denom = (luminance_ref(p) ** 2 + LOSS_EPS)[:, None]
        value, grad = d ** 2 / denom, 2 * d / denom
    elif otype == "CrossEntropy":
        value, grad = -t * np.log(p), -t / p
    elif otype == "Variance":
        value, grad = t ** 2 * (1 / p - 1 / q), -t ** 2 / p ** 2
    else:
        raise KeyError(f"no reference for loss otype {otype!r}")
    return value / (q * n), grad / (q * n)


# Losses whose gradient column is the true derivative of the value column; the others treat a
# denominator that depends on p as a constant (§3.2), so finite differences do not apply to them.
LOSSES_WITH_TRUE_GRADIENT = ("L2", "L1", "Mape", "CrossEntropy", "Variance")


# ---------------------------------------------------------------------------------------------
# §5.4 pcg32
# ---------------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1


class Pcg32Ref:
    """§5.4 pcg32 (PCG-XSH-RR 64/32) in Python integers, one step at a time."""

    MULT = 0x5851F42D4C957F2D

    def __init__(self, seed, seq=1):
        self.state, self.inc = 0, ((seq << 1) | 1) & _M64
        self.next_uint()
        self.state = (self.state + seed) & _M64
        self.next_uint()

    def next_uint(self):
        old = self.state
        self.state = (old * self.MULT + self.inc) & _M64
        xs = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        rot = old >> 59
        return ((xs >> rot) | (xs << ((32 - rot) & 31))) & 0xFFFFFFFF

    def next_float(self):
        bits = (self.next_uint() >> 9) | 0x3F800000
        return np.uint32(bits).view(np.float32) - np.float32(1)

    def advance(self, n):
        for _ in range(n):
            self.next_uint()

    def floats(self, n):
        return np.array([self.next_float() for _ in range(n)], np.float32)

    def uniform_fill(self, n):
        """tcnn's generate_random: M = ceil(n/4) threads, thread i copies the generator, advances it by 4i
        and writes elements i + M·j (j < 4, while < n) with consecutive draws; then the generator advances n."""
        M, out = -(-n // 4), np.empty(n, np.float32)
        for i in range(M):
            thread = Pcg32Ref.__new__(Pcg32Ref)
            thread.state, thread.inc = self.state, self.inc
            thread.advance(4 * i)
            for j in range(4):
                if i + M * j < n:
                    out[i + M * j] = thread.next_float()
        self.advance(n)
        return out


def mlp_init_ref(rng, shapes, activation="ReLU"):
    """§2.4: matrix by matrix in storage order, U(−s, s) = draw·2s − s in float32 from sequential draws."""
    blocks = []
    for i, (rows, cols) in enumerate(shapes):
        if activation == "Sine":
            s = 30.0 / cols if i == 0 else np.sqrt(6.0 / cols)
        else:
            s = np.sqrt(6.0 / (rows + cols))
        s = np.float32(s)
        blocks.append(rng.floats(rows * cols) * (s * np.float32(2)) - s)
    return np.concatenate(blocks)
