#!/usr/bin/env python3
"""tinn against its peers on tiny-cuda-nn's image workload, measured side by side.

Every implementation runs as its own process (`tinn_image.py`, `peers/torch_image.py`
eager and with ``--compile``, `peers/drjit_image.py`), alternating implementations
within each repetition so that machine noise spreads evenly. Peers that are not
installed in ``--peer-python`` are skipped with a note. Prints the medians of train and
inference samples/s, ms per step, PSNR, peak memory, tinn's kernel launches and read-backs per
training step, and tinn's ratio to each peer;
``--json`` prints the raw runs and medians as JSON instead (with the run's date, commit, CPU and command);
``--render RUN.json`` writes that run's tables between the ``bench_image`` markers of ``docs/performance.md``.

    python benchmarks/bench_image.py --batches 16 18 --steps 30 --reps 3
    python benchmarks/bench_image.py --arch cuda --impls tinn torch --batches 18 20   # on an NVIDIA GPU

``--arch`` runs tinn on that Taichi arch; with ``cuda`` the PyTorch peers run on the GPU too.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import _doc

HERE = os.path.dirname(os.path.abspath(__file__))
IMPLS = {
    "tinn": ("tinn_image.py", [], "taichi"),
    "torch": ("peers/torch_image.py", [], "torch"),
    "torch.compile": ("peers/torch_image.py", ["--compile"], "torch"),
    "drjit": ("peers/drjit_image.py", [], "drjit"),
}


def available(python, module):
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def run(python, impl, batch, args, infer):
    script, extra, _ = IMPLS[impl]
    cmd = [python, os.path.join(HERE, script), "--batch", str(batch), "--steps", str(args.steps),
           "--threads", str(args.threads), *extra]
    if impl == "tinn":
        cmd += ["--arch", args.arch]
    elif args.arch == "cuda" and impl.startswith("torch"):
        cmd += ["--device", "cuda"]
    if args.image:
        cmd += ["--image", args.image]
    if not infer:
        cmd.append("--no-infer")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  {impl} @ {batch} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median(runs, key):
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 18], help="log2 of the batch sizes")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--image", default=None, help="default: data/images/default.jpg")
    ap.add_argument("--impls", nargs="+", default=list(IMPLS), choices=list(IMPLS))
    ap.add_argument("--peer-python", default=sys.executable, help="interpreter with torch / drjit installed")
    ap.add_argument("--arch", default="cpu", help="tinn's Taichi arch (cpu, cuda, vulkan, ...)")
    ap.add_argument("--json", action="store_true", help="print the raw runs and medians as JSON")
    ap.add_argument("--render", metavar="JSON", help="write the table between the bench_image markers of --doc "
                                                     "from a --json run's output, measure nothing")
    ap.add_argument("--doc", default=_doc.PERFORMANCE, help="default: docs/performance.md")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            render(json.load(f), args.doc)
        print(f"rewrote the bench_image table of {args.doc}")
        return

    impls = []
    for impl in args.impls:
        python = sys.executable if impl == "tinn" else args.peer_python
        if available(python, IMPLS[impl][2]):
            impls.append(impl)
        else:
            print(f"note: skipping {impl}: `import {IMPLS[impl][2]}` fails in {python}", file=sys.stderr)

    batches = [1 << b for b in args.batches]
    runs = {(i, b): [] for i in impls for b in batches}
    for rep in range(args.reps):
        for b in batches:
            for impl in impls:
                python = sys.executable if impl == "tinn" else args.peer_python
                result = run(python, impl, b, args, infer=(b == batches[-1]))
                if result:
                    runs[impl, b].append(result)
                    print(f"rep {rep} {impl:14s} batch {b:7d}: {result['train_samples_per_s'] / 1e6:.3f} M/s",
                          file=sys.stderr)

    summary = {f"{i}@{b}": {k: median(runs[i, b], k) for k in (
        "train_samples_per_s", "ms_per_step_median", "infer_samples_per_s", "psnr", "peak_rss_mib",
        "launches_per_step", "read_backs_per_step")}
        for i, b in runs}
    if args.json:
        print(json.dumps({"summary": summary, "runs": {f"{i}@{b}": r for (i, b), r in runs.items()},
                          "impls": impls, "batches": batches, "reps": args.reps, "steps": args.steps,
                          "threads": args.threads, "arch": args.arch, "machine": _doc.provenance(sys.argv)}, indent=1))
        return
    print(f"\nmedians of {args.reps} runs, {args.steps} timed steps each, {args.threads} threads\n")
    print(tables(summary, impls, batches))


def tables(summary, impls, batches) -> str:
    """The medians' table and tinn's ratio to each peer, in markdown."""
    fmt = lambda v, f: "–" if v is None else format(v, f)  # noqa: E731
    rows = ["| impl | batch | train M samples/s | ms/step | inference M samples/s | PSNR dB | peak MiB | "
            "launches / read-backs per step |", "|---|---|---|---|---|---|---|---|"]
    for i in impls:
        for b in batches:
            s = summary[f"{i}@{b}"]
            rows.append(
                f"| {i} | 2^{b.bit_length() - 1} | {fmt(s['train_samples_per_s'] and s['train_samples_per_s'] / 1e6, '.3f')}"
                f" | {fmt(s['ms_per_step_median'], '.1f')} | {fmt(s['infer_samples_per_s'] and s['infer_samples_per_s'] / 1e6, '.2f')}"
                f" | {fmt(s['psnr'], '.2f')} | {fmt(s['peak_rss_mib'], '.0f')} | "
                f"{fmt(s['launches_per_step'], 'g')} / {fmt(s['read_backs_per_step'], 'g')} |")
    if "tinn" in impls and len(impls) > 1:
        rows += ["", "tinn / peer ratios (median samples/s)", "",
                 "| peer | " + " | ".join(f"train 2^{b.bit_length() - 1}" for b in batches) + " | inference |",
                 "|---|" + "---|" * (len(batches) + 1)]
        for peer in impls:
            if peer == "tinn":
                continue
            cells = []
            for b in batches + [None]:
                key = "infer_samples_per_s" if b is None else "train_samples_per_s"
                bb = batches[-1] if b is None else b
                t, p = summary[f"tinn@{bb}"][key], summary[f"{peer}@{bb}"][key]
                cells.append("–" if not t or not p else f"{t / p:.2f}×")
            rows.append(f"| {peer} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def render(results, doc):
    """Rewrite the ``bench_image`` table of ``doc`` from a ``--json`` run's output."""
    m = results["machine"]
    text = (_doc.heading(m) + f" Medians of {results['reps']} runs of {results['steps']} timed steps, "
            f"{results['threads']} threads"
            + (f", tinn on {results['arch']}" if results.get("arch", "cpu") != "cpu" else "") + ".\n\n" + tables(results["summary"], results["impls"], results["batches"]))
    _doc.replace_between(doc, "bench_image", text)

if __name__ == "__main__":
    main()
