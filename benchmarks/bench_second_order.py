#!/usr/bin/env python3
"""Second order against first order: ``backward_backward_input`` vs ``backward`` of one model.

For the same forward context, times ``backward(ctx, dL_dy)`` (parameter and input gradients) and
``backward_backward_input(ctx, dL_ddLdx, dL_dy)`` (tcnn's second-order contract: dL2/d(dL_dy), dL2/dx
and dL2/dθ), alternating the two in every round; prints the medians and their ratio. The default
model is ``config_hash`` (HashGrid + 64-wide ReLU MLP) with one output (an SDF-like model).

    python benchmarks/bench_second_order.py [--batch 65536] [--rounds 15] [--config config_hash]
"""
import argparse
import json

import numpy as np
import taichi as ti

import tinn
from _timing import alternating_medians



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1 << 16)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--n-output-dims", type=int, default=1)
    ap.add_argument("--config", default="config_hash")
    ap.add_argument("--arch", default="cpu")
    args = ap.parse_args()
    tinn.init(arch=getattr(ti, args.arch), log_level=ti.WARN)
    model = tinn.create_from_config(2, args.n_output_dims, args.config).network
    rng = np.random.default_rng(0)
    x = rng.random((args.batch, 2), dtype=np.float32)
    dL_dy = rng.standard_normal((args.batch, args.n_output_dims)).astype(np.float32)
    dL_ddLdx = rng.standard_normal((args.batch, 2)).astype(np.float32)
    _, ctx = model.forward(x)

    def first():
        model.backward(ctx, dL_dy)

    def second():
        model.backward_backward_input(ctx, dL_ddLdx, dL_dy)

    med = alternating_medians({"backward": first, "backward_backward_input": second}, args.rounds)
    for name, ms in med.items():
        print(f"{name:24s} {ms:8.1f} ms")
    print(f"backward_backward_input / backward: {med['backward_backward_input'] / med['backward']:.2f}")
    print(json.dumps({"batch": args.batch, "ms": med}))


if __name__ == "__main__":
    main()
