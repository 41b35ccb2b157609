"""The fused MLP kernels alone: their cold compile time, and (on a GPU) a sweep of tilings.

    python benchmarks/fused_mlp.py compile [--arch vulkan] [--json]
    python benchmarks/fused_mlp.py sweep [--arch cuda] [--batch 262144] [--reps 50] [--json]

``compile``: in a fresh process with an empty Taichi kernel cache, builds config_hash's MLP (32 inputs, 64 x 2
ReLU, 3 outputs) on the device path and times its first forward + backward through the fused kernels (they
compile) and a second one (they run): ``compile = first - again``, wall and CPU seconds of the process
(CPU time is less sensitive to other jobs on a shared machine). Works on any checkout that has the fused
kernels (it only names ``tinn.networks._kernel_mlp.FUSED_ARCHS``).

``sweep``: times forward + backward of the same MLP at ``--batch`` for each tiling of ``SWEEP`` (samples per
tile, threads, blocks, shared KiB), medians of ``--reps`` after a warm-up, synchronised; prints ms and the implied FP32
TFLOP/s (3 x 2 x 6,336 multiply-adds per sample). The tiling the plan uses per arch is
``tinn.networks._mlp_plan.FUSED_TILINGS``.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NET = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 64,
       "n_hidden_layers": 2}
SWEEP = [(64, 64, 264, 48), (64, 64, 528, 48), (64, 64, 1056, 48), (32, 32, 528, 48), (32, 32, 1056, 48),
         (32, 64, 1056, 48), (64, 128, 528, 48), (64, 64, 396, 64), (64, 64, 264, 96)]
"""(samples per tile, threads, blocks, KiB of shared memory a block may use); above 48 KiB Taichi allocates CUDA's
dynamic shared memory, and with 64 KiB config_hash's backward keeps every layer's weights staged for a run."""


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _model(arch: str):
    import numpy as np
    import taichi as ti
    sys.path.insert(0, ROOT)
    import tinn
    from tinn.runtime import program as _program
    from tinn.networks import _kernel_mlp
    tinn.init(arch=getattr(ti, arch))
    _program.FORCE = True
    _kernel_mlp.FUSED_ARCHS = (getattr(ti, arch),)
    return tinn, np, ti, tinn.create_network(32, 3, NET)


def compile_case(arch: str) -> dict:
    t0, c0 = time.perf_counter(), _cpu()
    tinn, np, ti, net = _model(arch)
    rng = np.random.default_rng(0)
    x, dy = rng.random((4096, 32), np.float32), rng.random((4096, 3), np.float32)
    times = []
    for _ in range(2):
        t, c = time.perf_counter(), _cpu()
        _, ctx = net.forward(x)
        assert getattr(ctx, "fused", None) is not None, "the fused kernels did not run"
        net.backward(ctx, dy)
        ti.sync()
        times.append((time.perf_counter() - t, _cpu() - c))
    return {"arch": arch, "compile_wall": times[0][0] - times[1][0], "compile_cpu": times[0][1] - times[1][1],
            "process_wall": time.perf_counter() - t0, "process_cpu": _cpu() - c0}


def sweep(arch: str, batch: int, reps: int) -> list:
    from dataclasses import replace
    tinn, np, ti, net = _model(arch)
    from tinn.networks import _mlp_plan
    rng = np.random.default_rng(0)
    from tinn.batch import buffers as _buffers
    x, dy = _buffers.put(rng.random((batch, 32), np.float32)), _buffers.put(rng.random((batch, 3), np.float32))
    base, rows = _mlp_plan.FUSED_TILINGS[arch], []
    for samples, threads, blocks, kib in SWEEP:
        _mlp_plan.FUSED_TILINGS[arch] = replace(base, samples=samples, threads=threads, blocks=blocks,
                                                shared_bytes=kib * 1024)
        try:
            for _ in range(3):
                net.backward(net.forward(x)[1], dy)
            ti.sync()
            ms = []
            for _ in range(reps):
                t = time.perf_counter()
                net.backward(net.forward(x)[1], dy)
                ti.sync()
                ms.append(1e3 * (time.perf_counter() - t))
            med = sorted(ms)[len(ms) // 2]
            rows.append({"samples": samples, "threads": threads, "blocks": blocks, "shared_kib": kib, "ms": med,
                         "tflops": 3 * 2 * 6336 * batch / (med * 1e-3) / 1e12})
        except Exception as e:                       # a tiling the arch cannot run (shared memory, registers)
            rows.append({"samples": samples, "threads": threads, "blocks": blocks, "shared_kib": kib,
                         "error": str(e)[:200]})
    _mlp_plan.FUSED_TILINGS[arch] = base
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("what", choices=["compile", "sweep"], help="what to measure")
    p.add_argument("--arch", default="vulkan", help="Taichi arch (cuda, vulkan, metal)")
    p.add_argument("--batch", type=int, default=2 ** 18, help="samples per pass (sweep)")
    p.add_argument("--reps", type=int, default=50, help="timed passes per tiling (sweep)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.what == "compile" and not a.inside:         # a fresh process on an empty kernel cache
        env = dict(os.environ, TI_OFFLINE_CACHE_FILE_PATH=tempfile.mkdtemp(prefix="tinn-fused-"))
        out = subprocess.run([sys.executable, __file__, "compile", "--arch", a.arch, "--inside"], env=env,
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        result = json.loads(out)
    elif a.what == "compile":
        print(json.dumps(compile_case(a.arch)))
        return
    else:
        result = {"arch": a.arch, "batch": a.batch, "sweep": sweep(a.arch, a.batch, a.reps)}
    if a.json:
        print(json.dumps(result))
    elif a.what == "compile":
        print(f"{a.arch}: fused forward + backward compile {result['compile_wall']:.2f} s wall, "
              f"{result['compile_cpu']:.2f} s CPU (process {result['process_wall']:.2f} s wall)")
    else:
        for row in result["sweep"]:
            print(row)


if __name__ == "__main__":
    main()
