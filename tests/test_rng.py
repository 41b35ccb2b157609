"""§5.4: tcnn's pcg32 and who draws what, against a one-step-at-a-time reference."""
import numpy as np
import pytest
from reference import Pcg32Ref, mlp_init_ref, mlp_shapes

import tinn
from tinn.runtime.rng import Pcg32


def test_reference_values_of_the_spec():
    """§5.4's values checked against tcnn's header, for the library and for the reference."""
    first = [0.147699356, 0.471029401, 0.173984647, 0.129117727]
    np.testing.assert_allclose(Pcg32(1337).draws(4), first, atol=1e-9)
    np.testing.assert_allclose(Pcg32Ref(1337).floats(4), first, atol=1e-9)
    lib, ref = Pcg32(1337), Pcg32Ref(1337)
    lib.advance(5)
    ref.advance(5)
    assert abs(lib.draws(1)[0] - 0.528302193) < 1e-9 and abs(ref.next_float() - 0.528302193) < 1e-9
    np.testing.assert_allclose(Pcg32(2150097757).draws(4), [0.114209533, 0.911352873, 0.565215945, 0.816819549],
                               atol=1e-9)


@pytest.mark.parametrize("seed, seq", [(1337, 1), (0, 1), (2150097757, 7), ((1 << 64) - 1, 123456)])
def test_draws_advance_and_uniform_fill_match_the_reference(seed, seq):
    lib, ref = Pcg32(seed, seq), Pcg32Ref(seed, seq)
    np.testing.assert_array_equal(lib.draws(37), ref.floats(37))
    lib.advance(1000)
    ref.advance(1000)
    np.testing.assert_array_equal(lib.uniform_fill(13), ref.uniform_fill(13))   # 13: not a multiple of 4
    np.testing.assert_array_equal(lib.draws(5), ref.floats(5))                  # the fill advanced by 13


def test_one_generator_per_sequence_at_once():
    """An array of sequences behaves as that many generators side by side."""
    seqs = np.array([1, 2, 3, 1000, 99_999])
    lib = Pcg32(42, seq=seqs)
    draws, fill, after = lib.draws(9), lib.uniform_fill(10), lib.draws(3)
    assert draws.shape == (5, 9) and fill.shape == (5, 10) and after.shape == (5, 3)
    for k, seq in enumerate(seqs):
        ref = Pcg32Ref(42, int(seq))
        np.testing.assert_array_equal(draws[k], ref.floats(9))
        np.testing.assert_array_equal(fill[k], ref.uniform_fill(10))
        np.testing.assert_array_equal(after[k], ref.floats(3))


def test_a_hundred_thousand_networks_each_initialised_from_its_own_sequence():
    """DESIGN: K up to 100,000+; instance k draws from pcg32(seed, seq = k + 1), as tcnn's k-th model would."""
    K, seed = 100_000, 5
    net = tinn.create_network(3, 2, {"otype": "FullyFusedMLP", "n_neurons": 8, "n_hidden_layers": 1},
                              n_instances=K, seed=seed)
    params = net.params()
    assert params.shape == (K, net.n_params)
    shapes = mlp_shapes(3, 8, 1, 2)
    for k in (0, 1, 54_321, K - 1):
        np.testing.assert_allclose(params[k], mlp_init_ref(Pcg32Ref(seed, seq=k + 1), shapes), rtol=1e-6, atol=0)


@pytest.mark.parametrize("deltas", [[0, 1, 2, 65535, 65536, 65537], list(range(0, 1 << 20, 4099)),
                                    [2 ** 31 - 1, 2 ** 40 + 12345, 2 ** 64 - 1]])
def test_jump_coefficients_are_mult_to_the_d_and_the_geometric_sum(deltas):
    """``d`` steps of ``s -> M s + inc`` are ``s -> M^d s + inc (M^(d-1) + ... + 1)`` mod 2^64: both coefficients from
    Python's integers (the sum as ``(M^d - 1) / (M - 1)``, taken modulo ``(M - 1) 2^64`` so the division is exact)."""
    from tinn.runtime.rng import _MULT, _jump_coeffs
    M, mod = int(_MULT), 1 << 64
    mults, totals = _jump_coeffs(np.array(deltas, dtype=np.uint64))
    for d, m, s in zip(deltas, mults, totals):
        assert int(m) == pow(M, d, mod)
        assert int(s) == (pow(M, d, (M - 1) * mod) - 1) // (M - 1) % mod
