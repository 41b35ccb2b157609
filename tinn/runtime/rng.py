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


def _jump_coeffs(deltas: np.ndarray):
    """``(MULT^d, MULT^(d-1) + ... + 1)`` mod 2^64 for each delta d (square-and-multiply)."""
    deltas = deltas.astype(np.uint64)
    acc_mult = np.ones_like(deltas)
    acc_sum = np.zeros_like(deltas)
    cur_mult, cur_sum = _MULT, _U64(1)
    with np.errstate(over="ignore"):
        for bit in range(64):
            if not (deltas >> _U64(bit)).any():
                break
            sel = ((deltas >> _U64(bit)) & _U64(1)).astype(bool)
            acc_mult = np.where(sel, acc_mult * cur_mult, acc_mult)
            acc_sum = np.where(sel, acc_sum * cur_mult + cur_sum, acc_sum)
            cur_sum = (cur_mult + _U64(1)) * cur_sum
            cur_mult = cur_mult * cur_mult
    return acc_mult, acc_sum


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
