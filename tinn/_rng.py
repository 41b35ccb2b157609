"""tcnn's pcg32 generator (PCG-XSH-RR 64/32), vectorised with numpy.

Parameter initialisation draws from it exactly as tcnn does (spec §5.4), so a
seed gives the same initial parameters on every machine.
"""
from __future__ import annotations

import numpy as np

_MULT = np.uint64(0x5851F42D4C957F2D)
_U64 = np.uint64


def _advance_coeffs(deltas: np.ndarray, inc: int):
    """(A, C) with state_after = A * state + C after advancing by each delta (mod 2^64)."""
    deltas = deltas.astype(np.uint64)
    acc_mult = np.ones_like(deltas)
    acc_plus = np.zeros_like(deltas)
    cur_mult, cur_plus = _MULT, _U64(inc)
    with np.errstate(over="ignore"):
        for bit in range(64):
            if not (deltas >> _U64(bit)).any():
                break
            sel = ((deltas >> _U64(bit)) & _U64(1)).astype(bool)
            acc_mult = np.where(sel, acc_mult * cur_mult, acc_mult)
            acc_plus = np.where(sel, acc_plus * cur_mult + cur_plus, acc_plus)
            cur_plus = (cur_mult + _U64(1)) * cur_plus
            cur_mult = cur_mult * cur_mult
    return acc_mult, acc_plus


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
    """``pcg32(seed, seq)`` with tcnn's seeding; draws come out as numpy arrays."""

    def __init__(self, seed: int, seq: int = 1):
        self.inc = ((seq << 1) | 1) & 0xFFFFFFFFFFFFFFFF
        self.state = 0
        self._step(1)
        self.state = (self.state + seed) & 0xFFFFFFFFFFFFFFFF
        self._step(1)

    def _step(self, n: int):
        a, c = _advance_coeffs(np.array([n], dtype=np.uint64), self.inc)
        with np.errstate(over="ignore"):
            self.state = int(a[0] * _U64(self.state) + c[0])

    def advance(self, n: int):
        if n:
            self._step(n)

    def draws(self, n: int) -> np.ndarray:
        """``n`` consecutive ``next_float()`` values (generator advanced by ``n``)."""
        a, c = _advance_coeffs(np.arange(n, dtype=np.uint64), self.inc)
        with np.errstate(over="ignore"):
            states = a * _U64(self.state) + c
        self.advance(n)
        return _output_float(states)

    def uniform_fill(self, n: int) -> np.ndarray:
        """tcnn's GPU ``generate_random``: element e gets draw 4*(e mod M) + e div M, M = ceil(n/4)."""
        m = -(-n // 4)
        e = np.arange(n)
        order = 4 * (e % m) + e // m
        return self.draws(max(4 * m, 1))[order] if n else np.zeros(0, np.float32)
