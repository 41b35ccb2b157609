#!/usr/bin/env python3
"""Network arrays: K small networks trained and queried at once, tinn against PyTorch.

Workload: K networks (Frequency encoding with 4 frequencies, MLP 32 x 2 hidden layers,
ReLU, 3 outputs, RelativeL2, Adam), S samples per network per step, given as a dense
(K, S, 2) batch (off the CPU a ``ti.ndarray`` on the device, as PyTorch's tensors are on the GPU).
Implementations, each in its own process:

* ``tinn``: one tinn object with ``n_instances=K``;
* ``torch``: PyTorch as a competent user writes it: the K weight matrices stacked into
  (K, out, in) tensors, ``torch.bmm`` per layer, one Adam over the stacks;
* ``tinn-loop``: separate single-network tinn models called one after another
  (timed on ``--loop-models`` of them; samples/s does not depend on how many).

Beside the time, tinn's rows give what one call costs the host after the warm-up: kernel launches and
read-backs per training step and per inference call (for ``tinn-loop``, of one of its models).

    python benchmarks/bench_network_array.py --k 4096 --samples 64 256 --reps 3
    python benchmarks/bench_network_array.py --arch cuda --impls tinn torch   # tinn on CUDA, PyTorch on the GPU

``--json`` prints the medians as JSON (with the run's date, commit, CPU and command); ``--render RUN.json``
writes that run's table between the ``bench_network_array`` markers of ``docs/performance.md``.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import _doc

HERE = os.path.dirname(os.path.abspath(__file__))
N_FREQ, WIDTH, HIDDEN, N_OUT = 4, 32, 2, 3
CONFIG = {"loss": {"otype": "RelativeL2"},
          "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15,
                        "l2_reg": 0.0},
          "encoding": {"otype": "Frequency", "n_frequencies": N_FREQ},
          "network": {"otype": "FullyFusedMLP", "n_neurons": WIDTH, "n_hidden_layers": HIDDEN}}


COLUMNS = ("train_samples_per_s", "infer_samples_per_s", "launches_per_step", "read_backs_per_step",
           "infer_launches_per_call", "infer_read_backs_per_call")
"""What a worker reports (PyTorch's workers report the first two)."""

WARMUP = 3
"""Untimed calls first (compilation, first touch of the step's memory), as in the image benchmark."""


def timed(fn, steps):
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run_tinn(k, s, steps, loop_models, arch="cpu"):
    import numpy as np
    import taichi as ti
    import tinn
    from _launches import per_call
    tinn.init(arch=getattr(ti, arch), log_level=ti.WARN)
    rng = np.random.default_rng(0)
    if loop_models:
        models = [tinn.create_from_config(2, N_OUT, CONFIG) for _ in range(loop_models)]
        x = rng.random((loop_models, s, 2), dtype=np.float32)
        y = rng.random((loop_models, s, N_OUT), dtype=np.float32)
        train = timed(lambda: [m.trainer.training_step(x[i], y[i]) for i, m in enumerate(models)], steps)
        infer = timed(lambda: [m.network.inference(x[i]) for i, m in enumerate(models)], steps)
        n = loop_models * s
        model, x, y = models[0], x[0], y[0]
    else:
        model = tinn.create_from_config(2, N_OUT, CONFIG, n_instances=k)
        x = rng.random((k, s, 2), dtype=np.float32)
        y = rng.random((k, s, N_OUT), dtype=np.float32)
        if arch != "cpu":                      # on a GPU the batches live there, as the PyTorch peer's do
            x, y = tinn.batch.buffers.put(x), tinn.batch.buffers.put(y)
        train = timed(lambda: (model.trainer.training_step(x, y), ti.sync()), steps)   # as the peer, which syncs
        infer = timed(lambda: (model.network.inference(x), ti.sync()), steps)
        n = k * s
    costs = {"{}_per_step": per_call(lambda: model.trainer.training_step(x, y)),
             "infer_{}_per_call": per_call(lambda: model.network.inference(x))}
    return {"train_samples_per_s": n / train, "infer_samples_per_s": n / infer,
            **{key.format(what): c[what] for key, c in costs.items() for what in ("launches", "read_backs")}}


def run_torch(k, s, steps, threads, device="cpu"):
    import torch
    torch.set_num_threads(threads)
    torch.set_default_device(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    n_in = 16                                  # 2 * 2 * N_FREQ = 16 encoded dims, no padding needed

    def stack(rows, cols):
        bound = math.sqrt(6 / (rows + cols))
        return torch.nn.Parameter(torch.empty(k, rows, cols).uniform_(-bound, bound))

    weights = [stack(WIDTH, n_in)] + [stack(WIDTH, WIDTH) for _ in range(HIDDEN - 1)] + [stack(16, WIDTH)]
    opt = torch.optim.Adam(weights, lr=1e-2, betas=(0.9, 0.99), eps=1e-15, fused=True)
    freqs = (2.0 ** torch.arange(N_FREQ)) * math.pi

    def model(x):                              # x (K, S, 2) -> (K, S, 3)
        phase = (x.unsqueeze(-1) * freqs).reshape(k, s, -1)
        h = torch.stack((torch.sin(phase), torch.cos(phase)), -1).reshape(k, s, n_in)
        for i, w in enumerate(weights):
            h = torch.bmm(h, w.transpose(1, 2))
            if i < len(weights) - 1:
                h = torch.relu(h)
        return h[..., :N_OUT]

    x = torch.rand(k, s, 2)
    y = torch.rand(k, s, N_OUT)

    def step():
        out = model(x)
        loss = ((out - y) ** 2 / (out.detach() ** 2 + 0.01)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()

    def infer():
        with torch.inference_mode():
            model(x)
        sync()

    return {"train_samples_per_s": k * s / timed(step, steps), "infer_samples_per_s": k * s / timed(infer, steps)}


def counts(medians, key):
    """'launches / read-backs' of one call (``key`` a COLUMNS name with ``{}``), '–' where not counted."""
    launches, reads = medians[key.format("launches")], medians[key.format("read_backs")]
    return "–" if launches is None else f"{launches:g} / {reads:g}"


def worker(args):
    if args.impl == "torch":
        result = run_torch(args.k[0], args.samples[0], args.steps, args.threads, "cuda" if args.arch == "cuda" else "cpu")
    else:
        result = run_tinn(args.k[0], args.samples[0], args.steps, args.loop_models if args.impl == "tinn-loop" else 0,
                          args.arch)
    print(json.dumps(result))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=[4096])
    ap.add_argument("--samples", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--impls", nargs="+", default=["tinn", "torch", "tinn-loop"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--loop-models", type=int, default=64)
    ap.add_argument("--peer-python", default=sys.executable)
    ap.add_argument("--impl", help=argparse.SUPPRESS)
    ap.add_argument("--arch", default="cpu", help="tinn's Taichi arch; with cuda PyTorch runs on the GPU too")
    ap.add_argument("--json", action="store_true", help="print the medians as JSON (with date, commit, CPU, command)")
    ap.add_argument("--render", metavar="JSON", help="write the table between the bench_network_array markers of "
                                                     "--doc from a --json run's output, measure nothing")
    ap.add_argument("--doc", default=_doc.PERFORMANCE, help="default: docs/performance.md")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            render(json.load(f), args.doc)
        print(f"rewrote the bench_network_array table of {args.doc}")
        return
    if args.impl:
        return worker(args)

    runs = {}
    for rep in range(args.reps):
        for k in args.k:
            for s in args.samples:
                for impl in args.impls:
                    python = args.peer_python if impl == "torch" else sys.executable
                    cmd = [python, __file__, "--impl", impl, "--k", str(k), "--samples", str(s), "--steps",
                           str(args.steps), "--threads", str(args.threads), "--loop-models", str(args.loop_models),
                           "--arch", args.arch]
                    proc = subprocess.run(cmd, capture_output=True, text=True)
                    if proc.returncode:
                        print(f"{impl} K={k} S={s} failed or is not installed:\n{proc.stderr[-1500:]}", file=sys.stderr)
                        continue
                    runs.setdefault((impl, k, s), []).append(json.loads(proc.stdout.strip().splitlines()[-1]))
                    print(f"rep {rep} {impl} K={k} S={s}: {runs[impl, k, s][-1]}", file=sys.stderr)
    med = {key: {m: statistics.median(r[m] for r in rs) if m in rs[0] else None for m in COLUMNS}
           for key, rs in runs.items()}
    if args.json:
        out = {f"{i}@K={k},S={s}": v for (i, k, s), v in med.items()}
        out.update(reps=args.reps, steps=args.steps, threads=args.threads, arch=args.arch,
                   machine=_doc.provenance(sys.argv))
        print(json.dumps(out, indent=1))
        return
    print(f"\nmedians of {args.reps} runs ({args.steps} timed steps each after {WARMUP} untimed), "
          f"{args.threads} threads\n")
    print(table(med))


def table(med) -> str:
    """The medians ``{(impl, K, S): {column: value}}`` and tinn's ratios, in markdown."""
    rows = ["| impl | K | samples/network | train M samples/s | inference M samples/s | train ratio tinn/impl | "
            "inference ratio | launches / read-backs per step | per inference |", "|---|---|---|---|---|---|---|---|---|"]
    for (impl, k, s), v in med.items():
        t = med.get(("tinn", k, s))
        ratio = lambda key: f"{t[key] / v[key]:.2f}×" if t else "–"  # noqa: E731
        rows.append(f"| {impl} | {k} | {s} | {v['train_samples_per_s'] / 1e6:.3f} | {v['infer_samples_per_s'] / 1e6:.3f} | "
                    f"{ratio('train_samples_per_s')} | {ratio('infer_samples_per_s')} | {counts(v, '{}_per_step')} | "
                    f"{counts(v, 'infer_{}_per_call')} |")
    return "\n".join(rows) + "\n"


def render(results, doc):
    """Rewrite the ``bench_network_array`` table of ``doc`` from a ``--json`` run's output."""
    med = {}
    for key, value in results.items():
        if "@K=" in key:
            impl, rest = key.split("@K=", 1)
            k, s = rest.split(",S=")
            med[impl, int(k), int(s)] = value
    text = (_doc.heading(results["machine"]) + f" Medians of {results['reps']} runs of {results['steps']} timed "
            f"steps after {WARMUP} untimed, {results['threads']} threads"
            + (f", tinn on {results['arch']}" if results.get("arch", "cpu") != "cpu" else "") + ".\n\n" + table(med))
    _doc.replace_between(doc, "bench_network_array", text)

if __name__ == "__main__":
    main()
