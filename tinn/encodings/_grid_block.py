"""The grid's parameter gradients off the CPU, with the levels of small tables aggregated per block.

Adding every sample's contribution to the gradients takes ``2^D F`` global atomic adds per sample and
level; on a coarse level many samples hit the same entries, and their adds queue on them. A level whose
table fits a block's shared memory (``fits``) is instead summed in a shared copy of its gradients: a
block of ``T`` threads walks over the tiles ``block, block + n_blocks, ...`` of ``T`` samples (one per
thread), adds each tile into the shared copy, and at the end adds each entry it touched to the
gradients: one global atomic add per touched entry and feature per block.

Float atomics on shared memory are not portable (Taichi's SPIR-V backend has none), so a tile's adds
go in rounds instead: every corner of every sample claims a slot of its entry with an integer shared
atomic (two 16-bit counters per int; a tile makes at most ``T 2^D < 2^16`` claims), round ``r`` adds
the corners whose slot is ``r`` (at most one per entry), and a tile takes as many rounds as its most
claimed entry has claims.
"""
import taichi as ti
from taichi.lang import impl

from ..runtime.kernels import ARENA, F32_2D, arena_kernel

T = 128                 # threads per block, one sample each
MAX_BLOCKS = 256        # about two blocks per multiprocessor of a large GPU; fewer blocks, fewer global adds
SHARED_BYTES = 48 << 10
"""Shared memory a block may take on CUDA (its static limit); other archs take ``OTHER_SHARED_BYTES``."""
OTHER_SHARED_BYTES = 32 << 10
"""Vulkan guarantees 16 KiB; desktop GPUs, Apple's and Mesa's llvmpipe offer 32 KiB or more."""


def shared_words(size: int, F: int) -> int:
    """Shared 32-bit words a level of ``size`` entries takes: F sums and half a claim counter per entry, and
    the tile's round count."""
    return size * F + (size + 1) // 2 + 1


def fits(size: int, F: int) -> bool:
    budget = SHARED_BYTES if impl.current_cfg().arch == ti.cuda else OTHER_SHARED_BYTES
    return shared_words(size, F) * 4 <= budget


def n_blocks(B: int) -> int:
    return max(1, min(-(-B // T), MAX_BLOCKS))


def block_scatter(D: int, F: int, interp: str, fn, geometry, bounds, runs, size: int):
    """The kernel adding dL/dθ (or with ``second`` dL2/dθ) of the levels of ``runs`` (index mode, row r of the
    grid's run bounds: its levels are the table rows ``bounds[gb + r]`` to ``bounds[gb + r + 1]``) to the
    gradients ``G[0, base + ...]``; ``size``: the largest table of those levels."""
    C = 1 if interp == "Nearest" else 1 << D
    n_sums = size * F
    n_claims = shared_words(size, F) - n_sums          # the last one counts the tile's rounds

    @ti.func
    def zero(a: ti.template(), n, s):
        for j in range((n + T - 1) // T):
            if s + j * T < n:
                a[s + j * T] = 0

    @ti.func
    def claim(claims: ti.template(), key):
        """This corner's slot among the tile's corners on entry ``key``."""
        shift = (key & 1) * 16
        slot = (ti.atomic_add(claims[key >> 1], 1 << shift) >> shift) & 0xFFFF
        ti.atomic_max(claims[n_claims - 1], slot + 1)
        return slot

    @arena_kernel
    def scatter(G: ARENA, base: ti.i32, gb: ti.i32, x: F32_2D, dy: F32_2D, n_blocks: ti.i32, second: ti.template(),
                g: F32_2D, zero_n: ti.i32):
        for i in range(zero_n):                                    # overwrite: zeros under the adds
            G[0, fn.at(base, i)] = 0.0
        B = x.shape[0]
        n_tiles = (B + T - 1) // T
        ti.loop_config(block_dim=T)
        for i in range(n_blocks * T):
            s, block = i % T, i // T
            sums = ti.simt.block.SharedArray((n_sums,), ti.f32)
            claims = ti.simt.block.SharedArray((n_claims,), ti.i32)
            g0 = bounds[gb]
            for mode, q in ti.static(runs):
                for l in range(bounds[gb + q], bounds[gb + q + 1]):
                    lv = geometry[l]
                    n = ti.cast(lv.size, ti.i32) * F
                    zero(sums, n, s)
                    zero(claims, n_claims, s)
                    ti.simt.block.sync()
                    for j in range((n_tiles - block + n_blocks - 1) // n_blocks):
                        b = (block + j * n_blocks) * T + s
                        keys, slots = ti.Vector.zero(ti.i32, C), ti.Vector([-1] * C, ti.i32)
                        values = ti.Matrix.zero(ti.f32, C, F)
                        if ti.static(not second or interp != "Nearest"):
                            if b < B:
                                dy_l = fn.row(dy, b, F, (l - g0) * F)
                                keys, values = fn.corner_terms(fn.row(x, b, D, 0), lv, mode, dy_l,
                                                               second, fn.gs_row(second, g, b))
                                for c in ti.static(range(C)):
                                    slots[c] = claim(claims, keys[c])
                        ti.simt.block.sync()
                        n_rounds = claims[n_claims - 1]
                        ti.simt.block.sync()                       # read by all before it is reset
                        for r in range(n_rounds):
                            for c in ti.static(range(C)):
                                if slots[c] == r:                  # the only corner on its entry this round
                                    for f in ti.static(range(F)):     # no "+=": Taichi makes it atomic
                                        e = keys[c] * F + f
                                        sums[e] = sums[e] + values[c, f]
                            ti.simt.block.sync()
                        for c in ti.static(range(C)):
                            if slots[c] >= 0:
                                claims[keys[c] >> 1] = 0
                        if s == 0:
                            claims[n_claims - 1] = 0
                        ti.simt.block.sync()
                    start = ti.cast(lv.offset, ti.i32) * F
                    for j in range((n + T - 1) // T):
                        e = s + j * T
                        if e < n and sums[e] != 0.0:
                            ti.atomic_add(G[0, fn.at(base, start + e)], sums[e])
                    ti.simt.block.sync()                           # before the next level zeroes the sums

    return scatter
