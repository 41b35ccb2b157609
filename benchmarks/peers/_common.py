"""Shared helpers for the peer benchmarks (numpy only; no torch / drjit here).

Workload: tiny-cuda-nn sample "mlp_learning_an_image" with config_hash.json.
  loss      RelativeL2  (pred-target)^2 / (stopgrad(pred)^2 + 0.01), mean over B*3
  optimizer Adam lr 1e-2, beta1 0.9, beta2 0.99, eps 1e-15, l2_reg 1e-6 (MLP only)
  encoding  HashGrid, 16 levels x 2 features, 2^15 entries/level, base res 16,
            per-level scale 1.5, bilinear, init U(-1e-4, 1e-4)
  network   FullyFusedMLP 32 -> 64 -> 64 -> 16 (3 used), ReLU, no bias
"""
from __future__ import annotations

import json
import math
import os
import resource
import sys
import time

import numpy as np

# ---------------------------------------------------------------- config ---
N_LEVELS = 16
N_FEATURES = 2
LOG2_HASHMAP = 15
BASE_RES = 16
PER_LEVEL_SCALE = 1.5
PRIME_Y = 2654435761          # tcnn coherent_prime_hash primes (1, 2654435761)

LR = 1e-2
BETA1, BETA2 = 0.9, 0.99
EPS = 1e-15
L2_REG = 1e-6
N_NEURONS = 64
N_OUT_PADDED = 16
N_OUT_USED = 3

DEFAULT_IMAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "images", "default.jpg")


def grid_levels():
    """Per-level (scale, resolution, n_entries, offset, dense) exactly as tcnn.

    tcnn: scale = exp2(l * log2(per_level_scale)) * base_res - 1
          res   = ceil(scale) + 1
          entries = min(next_multiple(res^D, 8), 2^log2_hashmap)
          dense iff res^D <= entries (else coherent prime hash)
    """
    levels = []
    offset = 0
    hashmap = 1 << LOG2_HASHMAP
    f32 = np.float32
    log2_pls = np.log2(f32(PER_LEVEL_SCALE))
    for l in range(N_LEVELS):
        # float32 arithmetic like tcnn's exp2f/ceilf (level 3 gives 53.0 -> res 54,
        # whereas float64 gives 53.00000000000001 -> res 55)
        scale = float(np.exp2(f32(l) * log2_pls) * f32(BASE_RES) - f32(1.0))
        res = int(math.ceil(scale)) + 1
        n = res ** 2
        n = ((n + 7) // 8) * 8
        n = min(n, hashmap)
        dense = res ** 2 <= n
        levels.append(dict(scale=scale, res=res, size=n, offset=offset, dense=dense))
        offset += n
    return levels, offset


# ------------------------------------------------------------------ image ---
def load_image(path: str | None):
    """Load an image as float32 HxWx3 in [0,1] (plain /255, no gamma).

    Returns (img, description). Falls back to a synthetic 512x512 image when
    the path does not exist.
    """
    if path and os.path.exists(path):
        import imageio.v3 as iio
        img = np.asarray(iio.imread(path))
        if img.ndim == 2:
            img = np.repeat(img[:, :, None], 3, axis=2)
        img = img[:, :, :3]
        scale = 65535.0 if img.dtype == np.uint16 else 255.0
        img = np.ascontiguousarray(img.astype(np.float32) / scale)
        return img, f"{path} ({img.shape[1]}x{img.shape[0]})"
    # Synthetic fallback: smooth gradients + rings + checker, 512x512.
    h = w = 512
    yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    r = np.sqrt((xx - 0.5) ** 2 + (yy - 0.5) ** 2)
    img = np.stack([
        0.5 + 0.5 * np.sin(40 * r),
        xx,
        ((np.floor(xx * 16) + np.floor(yy * 16)) % 2) * 0.8 + 0.1 * yy,
    ], axis=2).astype(np.float32)
    return np.ascontiguousarray(img), "SYNTHETIC 512x512 (image file missing)"


def psnr(pred: np.ndarray, ref: np.ndarray) -> float:
    """PSNR in dB of pred (clipped to [0,1]) against ref, both HxWx3."""
    mse = float(np.mean((np.clip(pred, 0.0, 1.0) - ref) ** 2, dtype=np.float64))
    return 10.0 * math.log10(1.0 / max(mse, 1e-20))


# ------------------------------------------------------------- monitoring ---
class CpuMonitor:
    """Measures how much CPU *other* processes used while a region ran.

    foreign_cores = (machine busy jiffies - this process's jiffies) / wall / HZ.
    On this shared 2-vCPU box other jobs may run concurrently; this number
    says how contended a measurement was (0 = machine was ours alone).
    """
    HZ = os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _machine():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + v[4]
        return sum(v[:8]) - idle          # busy jiffies (user..steal)

    @staticmethod
    def _self():
        with open("/proc/self/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
        return int(v[11]) + int(v[12])    # utime + stime (all threads)

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.m0, self.s0 = self._machine(), self._self()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t0
        dm, ds = self._machine() - self.m0, self._self() - self.s0
        self.wall = wall
        self.self_cores = ds / self.HZ / max(wall, 1e-9)
        self.foreign_cores = max(dm - ds, 0) / self.HZ / max(wall, 1e-9)
        return False


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def emit(result: dict):
    """Print the result dict as the last stdout line (JSON)."""
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
