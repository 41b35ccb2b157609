#!/usr/bin/env python3
"""The cost of training through ``tinn.torch`` instead of tinn's own trainer, in one process.

Both train ``config_hash.json`` (or ``--config``) on the same batches: tinn's
``trainer.training_step(x, y)`` (forward, RelativeL2, backward, tinn's Adam) against
``tinn.torch.NetworkWithInputEncoding`` with the same loss written in torch and
``torch.optim.Adam`` (the config's learning rate, betas and epsilon): ``model(x)``,
``loss.backward()``, ``optimizer.step()``. The two steps alternate, so load on the
machine hits both alike; each batch is drawn before the timed region. Prints the median
ms per step of each, and their ratio (bridge / native).

    python benchmarks/bench_torch_bridge.py --batch 65536 --steps 40
"""
import argparse
import json
import os
import time

import numpy as np
import taichi as ti
import torch

import tinn
import tinn.torch as tt



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="config_hash")
    ap.add_argument("--batch", type=int, default=1 << 16)
    ap.add_argument("--steps", type=int, default=40, help="timed steps of each")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps of each first")
    ap.add_argument("--threads", type=int, default=2, help="Taichi's CPU threads")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch's intra-op threads (its share of a step is a few element-wise passes; more "
                         "OpenMP threads than free cores make each of them wait on a descheduled thread)")
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()

    tinn.init(arch=ti.cpu, cpu_max_num_threads=args.threads, log_level=ti.WARN)
    torch.set_num_threads(args.torch_threads)
    config = tinn.load_config(args.config)
    native = tinn.create_from_config(2, 3, config, seed=args.seed)
    model = tt.NetworkWithInputEncoding(2, 3, config["encoding"], config["network"], seed=args.seed)
    opt_cfg = config.get("optimizer", {})
    optimizer = torch.optim.Adam(model.parameters(), lr=opt_cfg.get("learning_rate", 1e-3),
                                 betas=(opt_cfg.get("beta1", 0.9), opt_cfg.get("beta2", 0.999)),
                                 eps=opt_cfg.get("epsilon", 1e-8))

    def bridge_step(x, y):
        output = model(x)
        loss = ((output - y) ** 2 / (output.detach() ** 2 + 0.01)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    rng = np.random.default_rng(args.seed)
    times = {"native": [], "bridge": []}
    for step in range(args.warmup + args.steps):
        x = rng.random((args.batch, 2), dtype=np.float32)
        y = rng.random((args.batch, 3), dtype=np.float32)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        order = ("native", "bridge") if step % 2 == 0 else ("bridge", "native")
        for which in order:
            t0 = time.perf_counter()
            if which == "native":
                native.trainer.training_step(x, y)
            else:
                bridge_step(xt, yt)
            if step >= args.warmup:
                times[which].append(time.perf_counter() - t0)
    medians = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    result = {"batch": args.batch, "steps": args.steps, "threads": args.threads, "torch_threads": args.torch_threads,
              "native_ms_median": round(medians["native"], 2), "bridge_ms_median": round(medians["bridge"], 2),
              "ratio": round(medians["bridge"] / medians["native"], 3),
              "load_avg_1min": os.getloadavg()[0]}
    print(f"native training_step {medians['native']:.1f} ms, tinn.torch + torch.optim.Adam "
          f"{medians['bridge']:.1f} ms (medians of {args.steps}): ratio {result['ratio']:.3f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
