"""Seeded config fuzzer: random configs over every otype, half with one mutated value.

Every case must build and train two steps with finite losses and outputs, or raise a
``TypeError`` / ``ValueError`` from inside tinn. Cases run in a few long-lived worker
processes (``fuzz_worker.py``, restarted after a crash), so a segfault, an abort or a hang
is reported as a failing case instead of killing the test run.

Configs cover every registered encoding (Composite nested two deep), network, activation,
loss and optimizer (wrappers nested up to three deep, Composite with slices sized from
the model), with sizes kept small. A mutation replaces one value anywhere in the config
(or a factory argument) by 0, -1, a huge number, ±Inf, NaN, a value of the wrong type, adds
an unknown key or misspells an otype.

Non-finite results are excluded from the finiteness check only where they are the
mathematics, not a bug: Exponential activations (exp of exp overflows float32),
CrossEntropy and Variance losses (log and division of predictions that may be <= 0), and a
float key mutated to a huge but valid value (a learning rate of 1e30 overflows float32).

The full suite (``TINN_FULL=1``) runs all ``N_CASES`` cases; the default suite an evenly spread
``DEFAULT_CASES`` of them. The workers start ``ti.cpu`` whatever ``TINN_ARCH`` is, so the tests run in
the CPU pass only; they end on end of input, so Taichi writes their kernel cache.
"""
import json
import math
import os
import random
import select
import subprocess
import sys
import time

import pytest

from conftest import spread
from tinn.registry import encodings, losses, networks
from tinn.networks.activations import NAMES as ACTIVATIONS

SEED, N_CASES, N_WORKERS = 20261124, 300, 2
DEFAULT_CASES = 6
CASE_TIMEOUT = 120                  # seconds without an answer: a hang
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_worker.py")

HUGE = [2 ** 31, 2 ** 40, 2 ** 63, 1e9, 1e30]
WRONG_TYPE = ["64", True, None, [1], {"a": 1}]
LEAF_OPTIMIZERS = ["SGD", "Adam", "Novograd", "Shampoo"]
WRAPPERS = ["Ema", "Average", "Batched", "ExponentialDecay", "Lookahead"]


def spelled(rng, name):
    return name.lower() if rng.random() < 0.2 else name


GRID_PRESETS = [   # a few grids, so that their (per-config) kernels are shared between cases
    {"n_levels": 2, "n_features_per_level": 2, "base_resolution": 4, "per_level_scale": 1.5},
    {"n_levels": 3, "n_features_per_level": 4, "base_resolution": 3, "per_level_scale": 1.5,
     "interpolation": "Smoothstep"},
    {"n_levels": 1, "n_features_per_level": 8, "base_resolution": 5, "interpolation": "Nearest"},
    {"n_levels": 4, "n_features_per_level": 1, "base_resolution": 2, "per_level_scale": 1.25},
]


def grid(rng, otype):
    cfg = {"otype": otype, **rng.choice(GRID_PRESETS)}
    if otype in ("HashGrid", "Grid"):
        cfg["log2_hashmap_size"] = rng.choice([4, 8])
    if otype == "Grid":
        cfg["type"] = rng.choice(["Hash", "Tiled"])
    return cfg


def encoding(rng, n_in, depth=0):
    names = [n for n in encodings.names() if depth < 2 or n not in ("Composite",)]
    otype = rng.choice(names)
    if otype in ("HashGrid", "Grid", "DenseGrid", "TiledGrid"):
        return grid(rng, otype)
    if otype == "Permutohedral":         # a grid preset's levels, a small table
        preset = {k: v for k, v in rng.choice(GRID_PRESETS).items() if k != "interpolation"}
        return {"otype": spelled(rng, otype), **preset, "log2_hashmap_size": rng.choice([4, 8])}
    cfg = {"otype": spelled(rng, otype)}
    if otype == "Identity":
        cfg.update(scale=rng.choice([0.5, 1.0, 2.0]), offset=rng.choice([0.0, -0.5]))
    elif otype in ("Frequency", "TriangleWave"):
        cfg["n_frequencies"] = rng.randint(1, 6)
    elif otype == "OneBlob":
        cfg["n_bins"] = rng.choice([2, 4, 8, 16, 64])
    elif otype == "SphericalHarmonics":
        cfg["degree"] = rng.randint(1, 8)
    elif otype in ("NRC", "OneBlobFrequency"):
        cfg.update(n_frequencies=rng.randint(1, 6), n_bins=rng.choice([2, 4]))
    elif otype == "Composite":
        parts, left = [], n_in
        for i in range(rng.randint(1, 3)):
            n = rng.randint(1, max(1, left)) if i < 2 else left
            part = encoding(rng, n, depth + 1)
            if rng.random() < 0.8:
                part["n_dims_to_encode"] = n
            parts.append(part)
            left = max(0, left - n)
        cfg.update(nested=parts, reduction=rng.choice(["Concatenation"] * 4 + ["Sum", "Product"]))
    return cfg


def network(rng):
    return {"otype": spelled(rng, rng.choice(networks.names())), "n_neurons": rng.choice([1, 4, 16, 32, 64]),
            "n_hidden_layers": rng.randint(0, 4), "activation": spelled(rng, rng.choice(ACTIVATIONS)),
            "output_activation": spelled(rng, rng.choice(["None", "None", *ACTIVATIONS]))}


def leaf(rng):
    otype = rng.choice(LEAF_OPTIMIZERS)
    cfg = {"otype": spelled(rng, otype), "learning_rate": rng.choice([1e-4, 1e-3, 1e-2])}
    if otype in ("Adam", "Novograd", "Shampoo") and rng.random() < 0.5:
        cfg.update(beta1=rng.choice([0.5, 0.9]), beta2=rng.choice([0.99, 0.999]))
    if otype in ("SGD", "Adam", "Shampoo") and rng.random() < 0.3:
        cfg["l2_reg"] = rng.choice([0.0, 1e-6])
    if otype == "Adam" and rng.random() < 0.3:
        cfg.update(adabound=rng.random() < 0.5, gradient_clipping_magnitude=rng.choice([0.0, 1.0]),
                   relative_decay=rng.choice([0.0, 0.01]))
    return cfg


def optimizer(rng, depth=0):
    r = rng.random()
    if depth < 3 and r < 0.35:
        otype = rng.choice(WRAPPERS)
        cfg = {"otype": otype, "nested": optimizer(rng, depth + 1)}
        cfg.update({"Ema": {"decay": rng.choice([0.9, 0.99])}, "Average": {"n_samples": rng.choice([1, 4, 16])},
                    "Batched": {"batch_size_multiplier": rng.choice([1, 2])},
                    "ExponentialDecay": {"decay_start": 1, "decay_interval": 1, "decay_base": 0.5},
                    "Lookahead": {"alpha": 0.5, "n_steps": rng.choice([1, 2])}}[otype])
        return cfg
    if depth == 0 and r < 0.45:
        return {"otype": "Composite", "nested": [{**leaf(rng), "n_params_to_optimize": "auto"},
                                                 {**optimizer(rng, depth + 2), "n_params_to_optimize": "auto"}]}
    return leaf(rng)


def paths(obj, prefix=()):
    """Every (path to a dict, key) in a nested config."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix, k
            yield from paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from paths(v, prefix + (i,))


def mutate(rng, case):
    """One mutation; returns its description and whether it set a float key to a huge valid value."""
    where = rng.random()
    if where < 0.1:                                  # a factory argument
        arg = rng.choice(["n_in", "n_out", "n_instances", "seed"])
        value = rng.choice([0, -1, 2 ** 40, None, 2.5, {"np": "int64", "v": 2}])
        case[arg] = value
        return f"{arg} = {value!r}", False
    dict_path, key = rng.choice([p for p in paths(case["config"])])
    target = case["config"]
    for k in dict_path:
        target = target[k]
    kind = rng.choice(["zero", "minus", "huge", "inf", "-inf", "nan", "type", "unknown", "otype"])
    if kind == "unknown":
        target[key + "_typo"] = 3
        return f"unknown key {key}_typo", False
    if kind == "otype" or key == "otype":
        if "otype" in target and isinstance(target["otype"], str):
            name = target["otype"]
            target["otype"] = name[:-1] if len(name) > 3 and rng.random() < 0.5 else name + "x"
            return f"otype {name!r} -> {target['otype']!r}", False
    old = target[key]
    value = {"zero": 0, "minus": -1, "huge": rng.choice(HUGE), "inf": math.inf, "-inf": -math.inf,
             "nan": math.nan, "type": rng.choice(WRONG_TYPE)}.get(kind, 0)
    target[key] = value
    huge_float = kind == "huge" and isinstance(old, float)
    return f"{'/'.join(map(str, dict_path + (key,)))}: {old!r} -> {value!r}", huge_float


def generate():
    rng = random.Random(SEED)
    cases = []
    for i in range(N_CASES):
        n_in = rng.choice([1, 2, 2, 3, 3, 3, 4, 5, 8, 9])
        config = {"encoding": encoding(rng, n_in), "network": network(rng), "optimizer": optimizer(rng),
                  "loss": {"otype": spelled(rng, rng.choice(losses.names()))}}
        case = {"id": i, "n_in": n_in, "n_out": rng.randint(1, 4), "n_instances": rng.choice([1, 1, 1, 2, 3]),
                "seed": rng.choice([0, 42, 1337, 2 ** 32 - 1]), "batch": rng.choice([1, 7, 64, 300]),
                "config": config, "mutation": None, "huge_float": False}
        if i % 2:
            case["mutation"], case["huge_float"] = mutate(rng, case)
        cases.append(case)
    return cases


def expected_nonfinite(case) -> str | None:
    """Why a non-finite result is the mathematics for this case, or None."""
    text = json.dumps(case["config"]).lower()
    if "exponential\"" in text and ("\"activation\": \"exponential\"" in text or
                                    "\"output_activation\": \"exponential\"" in text):
        return "Exponential activations overflow float32"
    if "crossentropy" in text or "variance" in text:
        return "CrossEntropy / Variance of predictions <= 0"
    if case["huge_float"]:
        return "a huge but valid float hyperparameter overflows float32"
    return None


class Worker:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.case = None
        self.started = None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("fuzz worker failed to start")

    def send(self, case):
        self.case, self.started = case, time.monotonic()
        payload = {k: case[k] for k in ("id", "n_in", "n_out", "n_instances", "seed", "batch", "config")}
        self.proc.stdin.write(json.dumps(payload) + "\n")
        self.proc.stdin.flush()

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def close(self):
        """End of input: the worker returns, and Taichi writes its kernel cache on the way out."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=CASE_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()


def run_all(cases):
    """Outcome per case id, with up to ``N_WORKERS`` workers; a dead or hung worker is replaced."""
    queue, results, workers = list(cases), {}, []
    try:
        workers = [Worker() for _ in range(N_WORKERS)]
        while len(results) < len(cases):
            for i, w in enumerate(workers):
                if w.case is None and queue:
                    w.send(queue.pop(0))
            busy = [w for w in workers if w.case is not None]
            ready, _, _ = select.select([w.proc.stdout for w in busy], [], [], 5.0)
            for w in busy:
                if w.proc.stdout in ready:
                    line = w.proc.stdout.readline()
                    if line:
                        answer = json.loads(line)
                        results[answer["id"]] = answer
                        w.case = None
                        continue
                    status = f"crash (exit code {w.proc.wait()})"
                elif time.monotonic() - w.started > CASE_TIMEOUT:
                    status = f"hang (no answer in {CASE_TIMEOUT} s)"
                else:
                    continue
                results[w.case["id"]] = {"id": w.case["id"], "status": status, "detail": ""}
                w.kill()
                workers[workers.index(w)] = Worker()
    finally:
        for w in workers:
            w.close()
    return results


CPU_WORKERS = pytest.mark.arch_independent("the workers start ti.cpu whatever TINN_ARCH is")


@CPU_WORKERS
def test_config_fuzz():
    cases = spread(generate(), DEFAULT_CASES)
    results = run_all(cases)
    failures, counts = [], {}
    for case in cases:
        r = results[case["id"]]
        status = r["status"]
        if status == "nonfinite" and expected_nonfinite(case):
            status = "nonfinite (expected)"
        counts[status] = counts.get(status, 0) + 1
        if status not in ("ok", "clear", "nonfinite (expected)"):
            failures.append(f"case {case['id']} [{status}] mutation={case['mutation']!r} "
                            f"n_in={case['n_in']} n_out={case['n_out']} K={case['n_instances']} "
                            f"seed={case['seed']} batch={case['batch']}\n  config={json.dumps(case['config'])}"
                            f"\n  {r['detail']}")
    print("outcomes:", counts)
    slow = sorted(results.values(), key=lambda r: -r.get("seconds", 0))[:8]
    print("slowest:", [(r["id"], r.get("seconds"), r["status"]) for r in slow])
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)
    unmutated_ok = sum(results[c["id"]]["status"] == "ok" for c in cases if c["mutation"] is None)
    assert unmutated_ok >= len(cases) // 5, f"only {unmutated_ok} unmutated configs trained: the generator is off"


def hostile_cases():
    """Values that once crashed the process or failed deep inside numpy or Taichi, each a clear error now:
    grid levels that shrink below one cell, OneBlob bins by the million (a large DenseGrid's draw:
    test_misuse.py, whose address-space test runs in a subprocess of its own)."""
    configs = [{"otype": otype, "n_levels": levels, "per_level_scale": scale, "base_resolution": 16,
                "log2_hashmap_size": 8}
               for otype in ("HashGrid", "DenseGrid", "TiledGrid")
               for scale, levels in ((1e-3, 4), (1e-30, 2), (0.8, 100))]
    configs += [{"otype": "OneBlob", "n_bins": 2 ** 20}, {"otype": "NRC", "n_bins": 2 ** 20}]
    return [{"id": i, "n_in": 8 if enc["otype"] == "NRC" else 3, "n_out": 1, "n_instances": 1, "seed": 1337,
             "batch": 64, "config": {"encoding": enc, "network": {"otype": "FullyFusedMLP", "n_neurons": 16},
                                     "optimizer": {"otype": "Adam"}, "loss": {"otype": "L2"}}}
            for i, enc in enumerate(configs)]


@CPU_WORKERS
def test_hostile_values_are_clear_errors():
    cases = hostile_cases()
    results = run_all(cases)
    unclear = [(c["config"]["encoding"], results[c["id"]]) for c in cases if results[c["id"]]["status"] != "clear"]
    assert not unclear, unclear


if __name__ == "__main__":                      # python tests/test_config_fuzz.py [N]: run and print outcomes
    N_CASES = DEFAULT_CASES = int(sys.argv[1]) if len(sys.argv) > 1 else N_CASES
    test_config_fuzz()
