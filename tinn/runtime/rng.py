"""tcnn's pcg32 generator (PCG-XSH-RR 64/32), vectorised with numpy.

Parameter initialisation draws from it exactly as tcnn does, so a
seed gives the same initial parameters on every machine. One ``Pcg32`` may stand
for many generators that differ only in their sequence (a network array draws
instance k from ``pcg32(seed, seq=k + 1)``): its draws then have a leading axis.

A step is ``state -> MULT * state + inc`` (mod 2^64), so n steps are
``state -> MULT^n * state + inc * (MULT^(n-1) + ... + 1)``: the two coefficients do
not depend on the sequence, and every draw is one multiply-add away from the state.
"""
from __future__ import annotations

import numpy as np

_MULT = np.uint64(0x5851F42D4C957F2D)
_U64 = np.uint64
CHUNK = 1 << 20             # elements drawn at a time (a few 8-byte temporaries each)


LOW_BITS = 16
"""Jumps are split ``d = hi 2^LOW_BITS + lo``: the low part's coefficients come from a table, the high part's the
same way in jumps of ``2^LOW_BITS``."""


def _table(mult, total, n: int):
    """The coefficients of the jumps ``j * step`` for ``j < n``, given those of one ``step`` (``mult``, ``total``):
    built by doubling, ``(M_a M_b, S_a + M_a S_b)`` for the jump ``a + b``."""
    mults, totals = np.ones(1, np.uint64), np.zeros(1, np.uint64)
    with np.errstate(over="ignore"):
        while len(mults) < n:
            mults, totals = np.concatenate([mults, mults * mult]), np.concatenate([totals, total + mult * totals])
            mult, total = mult * mult, (mult + _U64(1)) * total
    return mults[:n], totals[:n]


def _jump_coeffs(deltas: np.ndarray, mult=_MULT, total=_U64(1)):
    """``(MULT^d, MULT^(d-1) + ... + 1)`` mod 2^64 for each delta d (more generally, the coefficients of ``d`` jumps of
    one whose own are ``(mult, total)``): ``d = hi 2^16 + lo``, the low part looked up in a table (:func:`_table`),
    the high part the same way in jumps of 2^16, and the two joined, ``(M_lo M_hi, S_lo + M_lo S_hi)``."""
    deltas = deltas.astype(np.uint64)
    lo, hi = deltas & _U64((1 << LOW_BITS) - 1), deltas >> _U64(LOW_BITS)
    low_mults, low_totals = _table(mult, total, min(1 << LOW_BITS, int(deltas.max(initial=0)) + 1))
    if not hi.any():
        return low_mults[lo], low_totals[lo]
    with np.errstate(over="ignore"):                    # (the low table is whole: its last jump is 2^16 - 1)
        high_mults, high_totals = _jump_coeffs(hi, low_mults[-1] * mult, low_totals[-1] + low_mults[-1] * total)
        m_lo = low_mults[lo]
        return m_lo * high_mults, low_totals[lo] + m_lo * high_totals


def _output_float(states: np.ndarray) -> np.ndarray:
    """next_float() of generators whose *current* state is ``states``."""
    with np.errstate(over="ignore"):
        xs = (((states >> _U64(18)) ^ states) >> _U64(27)) & _U64(0xFFFFFFFF)
        rot = states >> _U64(59)
        xs = xs.astype(np.uint32)
        rot = rot.astype(np.uint32)
        out = (xs >> rot) | (xs << ((np.uint32(32) - rot) & np.uint32(31)))
    bits = (out >> np.uint32(9)) | np.uint32(0x3F800000)
    return bits.view(np.float32) - np.float32(1.0)


class Pcg32:
    """``pcg32(seed, seq)`` with tcnn's seeding; ``seq`` an int, or an array of sequences for as many
    generators (``shape`` is then ``seq.shape``); draws come out as numpy arrays of ``shape + (n,)``."""

    def __init__(self, seed: int, seq=1):
        seq = np.asarray(seq, dtype=np.uint64)
        self.shape = seq.shape
        with np.errstate(over="ignore"):
            self.inc = (seq << _U64(1)) | _U64(1)
            self.state = self.inc.copy()                      # state = 0, then one step
            self.state += _U64(seed & 0xFFFFFFFFFFFFFFFF)
        self.advance(1)

    def advance(self, n: int):
        if n:
            mult, total = _jump_coeffs(np.array(n))
            with np.errstate(over="ignore"):
                self.state = mult * self.state + self.inc * total

    def _floats_at(self, indices: np.ndarray) -> np.ndarray:
        """The ``next_float()`` values of the draws ``indices`` ahead, ``shape + indices.shape``, without advancing."""
        mult, total = _jump_coeffs(indices)
        with np.errstate(over="ignore"):
            return _output_float(mult * self.state[..., None] + self.inc[..., None] * total)

    def _fill(self, n: int, draw_of) -> np.ndarray:
        """``shape + (n,)`` float32 values, element e the draw ``draw_of(e)`` ahead; computed ``CHUNK``
        elements at a time, so that the temporary 8-byte arrays stay bounded whatever ``n``."""
        values = np.empty(self.shape + (n,), np.float32)
        for lo in range(0, n, CHUNK):
            values[..., lo:min(lo + CHUNK, n)] = self._floats_at(draw_of(np.arange(lo, min(lo + CHUNK, n))))
        return values

    def draws(self, n: int) -> np.ndarray:
        """``n`` consecutive ``next_float()`` values (generator advanced by ``n``)."""
        values = self._fill(n, lambda e: e)
        self.advance(n)
        return values

    def uniform_fill(self, n: int) -> np.ndarray:
        """tcnn's GPU ``generate_random``: element e gets draw 4*(e mod M) + e div M, M = ceil(n/4);
        afterwards the generator is advanced by n."""
        m = -(-n // 4)
        values = self._fill(n, lambda e: 4 * (e % m) + e // m)
        self.advance(n)
        return values
