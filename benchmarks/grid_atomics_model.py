#!/usr/bin/env python3
"""Global atomic adds of one backward pass of the hash grid off the CPU, counted by a NumPy model of its kernels.

The model reads nothing from a GPU: it replays which table entries each kernel adds to, for one batch, and
counts the global ``atomic_add`` calls (one per entry and feature):

* ``per sample`` (no aggregation): every sample adds ``2^D F`` values per level;
* ``block`` (``_grid_block.py``): a level whose table fits a block's shared memory (``fits``) is summed per
  block, then each entry the block touched gets one add per feature; blocks take tiles of ``T`` samples,
  ``block, block + n_blocks, ...``;
* ``block + per sample`` (the kernels before ``run_scatter``): the other levels per sample;
* ``block + runs`` (``_grid_kernels.py``'s ``run_scatter``, the other levels): a thread takes ``RUN``
  consecutive samples of one level and keeps each corner's sum in registers while the next sample touches the
  same entry: an entry gets one add per feature when a sample stops touching it (and at the end of the run);
* ``warp bound`` (not a kernel of tinn, a bound for comparison): the adds left if a warp of 32 consecutive
  samples merged every duplicate entry (CUDA's ``match_any``), per level.

Inputs: ``uniform`` (random points in [0, 1)^D, the image benchmark's batches) and ``image`` (the pixel
centres of a square image in raster order: neighbours in the batch are neighbours in space, as the
inference of an image or the samples along sorted rays are).

    python benchmarks/grid_atomics_model.py [--batch 262144] [--config data/config_hash.json] [--json]
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from tinn.encodings import _grid_block as block  # noqa: E402
from tinn.encodings._grid_funcs import PRIMES  # noqa: E402
from tinn.encodings._grid_kernels import RUN  # noqa: E402
from tinn.encodings.grid import level_geometry  # noqa: E402

WARP = 32


def corner_keys(x: np.ndarray, level, hashed: bool) -> np.ndarray:
    """(B, 2^D) table entries of the corners of each point of ``x`` (B, D) on one level (tcnn's index)."""
    scale, res, size, _, _ = level
    B, D = x.shape
    p = np.floor(x.astype(np.float32) * np.float32(scale) + np.float32(0.5)).astype(np.int64).astype(np.uint32)
    keys = np.empty((B, 1 << D), np.uint32)
    for c in range(1 << D):
        q = [p[:, d] + np.uint32((c >> d) & 1) for d in range(D)]
        idx = np.zeros(B, np.uint32)
        if hashed:
            for d in range(D):
                idx ^= q[d] * np.uint32(PRIMES[d])
            idx &= np.uint32(size - 1)
        else:
            for d in range(D - 1, -1, -1):
                idx = idx * np.uint32(res) + q[d]
            idx %= np.uint32(size)
        keys[:, c] = idx
    return keys


def block_adds(keys: np.ndarray, size: int) -> int:
    """Entries touched per block, summed over the blocks (``_grid_block.block_scatter``)."""
    B = keys.shape[0]
    nb = block.n_blocks(B)
    tile_block = (np.arange(B) // block.T) % nb
    pairs = tile_block[:, None].astype(np.int64) * size + keys
    return len(np.unique(pairs))


def run_adds(keys: np.ndarray, run: int) -> int:
    """Flushes of the per-thread corner sums: a corner's entry is added when the next sample of the
    thread's run does not touch it, and every corner at the end of the run."""
    B, C = keys.shape
    last = (np.arange(B) % run == run - 1) | (np.arange(B) == B - 1)
    kept = np.zeros((B, C), bool)
    kept[:-1] = (keys[:-1, :, None] == keys[1:, None, :]).any(axis=2)
    kept[last] = False
    return int((~kept).sum())


def warp_bound(keys: np.ndarray) -> int:
    B = keys.shape[0]
    group = np.arange(B, dtype=np.int64) // WARP
    return len(np.unique(group[:, None] * (1 << 32) + keys.astype(np.int64)))


def model(x: np.ndarray, levels, F: int, arch: str = "cuda"):
    """Per level: (size, aggregated per block?, adds per sample, block / run adds, warp bound), features counted."""
    budget = block.SHARED_BYTES if arch == "cuda" else block.OTHER_SHARED_BYTES
    rows = []
    for level in levels:
        keys = corner_keys(x, level, level[4])
        size = level[2]
        shared = block.shared_words(size, F) * 4 <= budget
        blocks = block_adds(keys, size) * F if shared else None
        rows.append(dict(size=size, block=shared, per_sample=keys.size * F,
                         before=blocks if shared else keys.size * F,
                         after=blocks if shared else run_adds(keys, RUN) * F,
                         warp_bound=warp_bound(keys) * F))
    return rows


def inputs(kind: str, B: int, D: int, seed: int = 0) -> np.ndarray:
    if kind == "uniform":
        return np.random.default_rng(seed).random((B, D), dtype=np.float32)
    side = int(round(B ** (1 / D)))
    assert side ** D == B, "image-like inputs need a batch that is a D-th power"
    grid = np.stack(np.meshgrid(*[(np.arange(side) + 0.5) / side] * D, indexing="ij")[::-1], -1)
    return grid.reshape(-1, D).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1 << 18)
    ap.add_argument("--dims", type=int, default=2)
    ap.add_argument("--config", default=os.path.join(HERE, "..", "data", "config_hash.json"))
    ap.add_argument("--arch", default="cuda", choices=("cuda", "vulkan"), help="whose shared memory budget")
    ap.add_argument("--json", action="store_true", help="print one JSON dict instead of the table")
    args = ap.parse_args()
    import commentjson
    with open(args.config) as f:
        enc = commentjson.load(f)["encoding"]
    F = enc.get("n_features_per_level", 2)
    levels, _ = level_geometry(args.dims, {"HashGrid": "Hash", "DenseGrid": "Dense", "TiledGrid": "Tiled"}.get(
        enc["otype"], enc.get("type", "Hash")), enc.get("n_levels", 16), enc.get("log2_hashmap_size", 19),
        enc.get("base_resolution", 16), enc.get("per_level_scale", 2.0))
    result = {}
    for kind in ("uniform", "image"):
        rows = model(inputs(kind, args.batch, args.dims), levels, F, args.arch)
        totals = {k: sum(r[k] for r in rows) for k in ("per_sample", "before", "after", "warp_bound")}
        result[kind] = dict(levels=rows, **totals)
    if args.json:
        print(json.dumps(dict(batch=args.batch, dims=args.dims, arch=args.arch, run=RUN, **result)))
        return
    print(f"global atomic adds of one backward, batch {args.batch}, D = {args.dims}, {args.arch}'s shared memory, "
          f"runs of {RUN} samples")
    for kind, r in result.items():
        print(f"\n{kind}: level | entries | kernel | per sample | block + per sample | block + runs | warp bound")
        for l, row in enumerate(r["levels"]):
            print(f"  {l:2d} | {row['size']:6d} | {'block' if row['block'] else 'runs':5s} | {row['per_sample']:9d} | "
                  f"{row['before']:9d} | {row['after']:9d} | {row['warp_bound']:9d}")
        print(f"  total: per sample {r['per_sample']:,}, block + per sample {r['before']:,}, block + runs "
              f"{r['after']:,} ({r['after'] / r['before']:.1%} of before), warp bound {r['warp_bound']:,}")


if __name__ == "__main__":
    main()
