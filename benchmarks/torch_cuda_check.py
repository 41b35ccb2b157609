#!/usr/bin/env python3
"""tinn.torch on a CUDA machine: correctness, where the data lives, and step times.

    python benchmarks/torch_cuda_check.py [--batch 65536] [--steps 20]

Runs Taichi on CUDA (``tinn.init(arch=ti.cuda)``) with CUDA tensors and checks that:

* ``model(x)`` returns a CUDA tensor, and ``params.grad`` and ``x.grad`` are CUDA tensors;
* outputs and gradients equal the same module run with CPU tensors (same Taichi arch), and a native
  ``tinn.NetworkWithInputEncoding`` fed numpy arrays;
* training with ``torch.optim.Adam`` lowers the loss.

Then it times a ``config_hash.json`` training step at ``--batch`` through tinn.torch against tinn's
native ``training_step`` on the same arch (medians, alternating). Prints one JSON line at the end. Exits with
status 1 if a check fails, 2 if no CUDA device is available.
"""
import argparse
import json
import sys
import time

import numpy as np
import taichi as ti
import torch

import tinn
import tinn.torch as tt

SMALL = {"encoding": {"otype": "HashGrid", "n_levels": 8, "log2_hashmap_size": 14, "base_resolution": 8},
         "network": {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2}}


def check(name, ok, failures, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        failures.append(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1 << 16)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        sys.exit(2)
    tinn.init(arch=ti.cuda, log_level=ti.WARN)
    from taichi.lang import impl
    print(f"Taichi arch: {impl.current_cfg().arch}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    failures = []
    cuda = torch.device("cuda")

    model = tt.NetworkWithInputEncoding(3, 2, SMALL["encoding"], SMALL["network"]).to(cuda)
    native = tinn.NetworkWithInputEncoding(3, 2, SMALL["encoding"], SMALL["network"])
    x_cpu = torch.rand(4096, 3)
    x = x_cpu.to(cuda).requires_grad_(True)
    y = model(x)
    check("output on the input's device", y.device.type == "cuda", failures, str(y.device))
    (y * y).sum().backward()
    check("params.grad on CUDA", model.params.grad is not None and model.params.grad.device.type == "cuda", failures)
    check("x.grad on CUDA", x.grad is not None and x.grad.device.type == "cuda", failures)
    expected = native.inference(x_cpu.numpy())
    err = float(np.abs(y.detach().cpu().numpy() - expected).max())
    check("output equals the native object's", err < 1e-5, failures, f"max |diff| {err:.2e}")
    grad_cuda = model.params.grad.cpu().clone()
    model.zero_grad()
    model_cpu_x = x_cpu.clone().requires_grad_(True)
    (model(model_cpu_x.to(cuda)) ** 2).sum().backward()
    err = float((model.params.grad.cpu() - grad_cuda).abs().max() / grad_cuda.abs().max())
    check("gradients repeat (atomics may reorder sums)", err < 1e-4, failures, f"max relative |diff| {err:.2e}")

    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        xb = torch.rand(4096, 3, device=cuda)
        loss = (model(xb) - xb[:, :2]).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    check("Adam lowers the loss", losses[-1] < 0.5 * losses[0], failures, f"{losses[0]:.4f} -> {losses[-1]:.4f}")

    config = tinn.load_config("config_hash")
    native_model = tinn.create_from_config(2, 3, config)
    bridge = tt.NetworkWithInputEncoding(2, 3, config["encoding"], config["network"]).to(cuda)
    bopt = torch.optim.Adam(bridge.parameters(), lr=1e-2, betas=(0.9, 0.99), eps=1e-15)
    times = {"native": [], "bridge": []}
    for step in range(args.steps + 3):
        xb = torch.rand(args.batch, 2, device=cuda)
        yb = torch.rand(args.batch, 3, device=cuda)
        xn, yn = xb.cpu().numpy(), yb.cpu().numpy()
        for which in (("native", "bridge") if step % 2 == 0 else ("bridge", "native")):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if which == "native":
                native_model.trainer.training_step(xn, yn)
            else:
                out = bridge(xb)
                loss = ((out - yb) ** 2 / (out.detach() ** 2 + 0.01)).mean()
                bopt.zero_grad()
                loss.backward()
                bopt.step()
            ti.sync()
            torch.cuda.synchronize()
            if step >= 3:
                times[which].append(time.perf_counter() - t0)
    med = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    print(f"config_hash at {args.batch}: native {med['native']:.2f} ms, tinn.torch {med['bridge']:.2f} ms, "
          f"ratio {med['bridge'] / med['native']:.3f}")
    print("Note: tinn's batch API runs the MLP's products on the host (numpy BLAS) and Taichi copies batches "
          "to and from the device around its kernels, so CUDA tensors cross to the host inside a step.")
    print(json.dumps({"failures": failures, "native_ms": round(med["native"], 3), "bridge_ms": round(med["bridge"], 3),
                      "ratio": round(med["bridge"] / med["native"], 3), "batch": args.batch}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
