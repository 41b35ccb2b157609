"""Cold and warm compile times of every public path of tinn: what a user waits for on first use.

    python benchmarks/compile_times.py [--cases train inference ...] [--arch cpu] [--json]

Each case runs in a fresh Python process with ``TI_OFFLINE_CACHE_FILE_PATH`` set to a new, empty
folder (**cold**: every kernel compiles), then once more in another process on that same folder
(**warm**: Taichi's offline cache holds the kernels). A case builds its model (``config_hash``:
HashGrid 16 levels, 2^15 table, 64 x 2 MLP; the second-order cases with one output and Softplus, an
SDF), then times its public call twice: the first call compiles, the second runs what is compiled.
Reported per case and run:

* ``start``: ``import taichi`` + ``import tinn`` + ``tinn.init`` (what any tinn program pays first);
* ``build``: creating the model (and the user's fields / stage objects);
* ``first``: the first call, compiles included; ``again``: the second call;
* ``compile`` = ``build + first - again``: what the path costs beyond a steady call; ``ccpu``: the same in CPU
  seconds of the process (all its threads: Taichi compiles on several);
* ``kernels``: Taichi kernels compiled (materialised) by build and the first call, and ``ast``: the
  seconds Taichi spent turning their Python into IR (repeated on every start, cache or not);
* ``wall``: the whole process, interpreter start-up to exit; ``cpu``: its CPU time (user + system, all
  threads): the work done, less sensitive than wall times to other jobs on a shared machine.

The last cases are what a user meets next: ``second_grid`` and ``second_width`` first train a ``config_hash``
model (before the clock starts), then time a model with another grid geometry (``per_level_scale`` 1.5,
``base_resolution`` 12) or another MLP width (32); ``backward_func`` and ``jacobian_func`` are user kernels
calling a model's per-sample backward or Jacobian (``func`` its forward).

``startup`` is the flagship example itself, ``examples/mlp_learning_an_image.py --steps 1``: its own
"Start-up (import to first step done)" line. ``ti_init`` is ``import taichi`` + ``ti.init`` alone.

Compile times scale with the machine's free cores: compare figures of one run only.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

T0 = time.perf_counter()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "config_hash"
CASES = ("ti_init", "startup", "train", "inference", "func", "stage", "gradient_stage",
         "backward_backward_input", "torch", "torch_second_order", "second_grid", "second_width", "backward_func",
         "jacobian_func")
SECOND = {"second_grid": ("encoding", {"per_level_scale": 1.5, "base_resolution": 12}),
          "second_width": ("network", {"n_neurons": 32})}
N = 4096


# -- inside a case's process -----------------------------------------------------------------------
class _Kernels:
    """Counts the Taichi kernels materialised (Python AST -> IR) and the seconds that took."""

    def __init__(self):
        from taichi.lang import kernel_impl
        self.count, self.ast = 0, 0.0
        original = kernel_impl.Kernel.materialize

        def materialize(kernel, key=None, args=None, arg_features=None):
            fresh = (key or (kernel.func, 0, kernel.autodiff_mode)) not in kernel.compiled_kernels
            t = time.perf_counter()
            result = original(kernel, key, args, arg_features)
            if fresh:
                self.count += 1
                self.ast += time.perf_counter() - t
            return result

        kernel_impl.Kernel.materialize = materialize


def _configs(second_order: bool):
    import tinn
    config = tinn.load_config(CONFIG)
    if second_order:
        config["network"] = dict(config["network"], activation="Softplus")
    return config


def _points(n, d, seed=0):
    import numpy as np
    return np.random.default_rng(seed).random((n, d), dtype=np.float32)


def _case(name):
    """``(build, call)``: build() makes the model and what the call needs; call() runs the path once."""
    import numpy as np
    import taichi as ti
    import tinn

    if name == "train" or name in SECOND:
        def build(changed=None):
            config = _configs(False)
            if changed is not None:
                part, keys = changed
                config[part] = dict(config[part], **keys)
            model = tinn.create_from_config(2, 3, config)
            x, y = _points(N, 2), _points(N, 3, 1)
            return lambda: model.trainer.training_step(x, y)
        if name in SECOND:
            return lambda: build(SECOND[name])
        return build
    if name == "inference":
        def build():
            model = tinn.create_from_config(2, 3, _configs(False))
            x = _points(N, 2)
            return lambda: model.network.inference(x)
        return build
    if name == "func":
        def build():
            model = tinn.create_from_config(2, 3, _configs(False))
            x, y = ti.Vector.field(2, ti.f32, N), ti.Vector.field(3, ti.f32, N)
            x.from_numpy(_points(N, 2))
            f = model.network.func

            @ti.kernel
            def user():
                for i in x:
                    y[i] = f(x[i])
            return lambda: (user(), ti.sync())
        return build
    if name in ("backward_func", "jacobian_func"):
        def build():
            model = tinn.create_from_config(2, 3, _configs(False))
            x, out = ti.Vector.field(2, ti.f32, N), ti.Vector.field(2, ti.f32, N)
            x.from_numpy(_points(N, 2))
            f = getattr(model.network, name)

            @ti.kernel
            def user():
                for i in x:
                    if ti.static(name == "backward_func"):
                        out[i] = f(x[i], ti.Vector([1.0, 0.0, 0.0]))
                    else:
                        y, J = f(x[i])
                        out[i] = ti.Vector([J[0, 0], J[1, 1]]) * y[0]
            return lambda: (user(), ti.sync())
        return build
    if name in ("stage", "gradient_stage"):
        second = name == "gradient_stage"

        def build():
            model = tinn.create_from_config(3, 1, _configs(second))
            x = ti.Vector.field(3, ti.f32, N, needs_grad=True)
            out = ti.Vector.field(3 if second else 1, ti.f32, N, needs_grad=True)
            loss = ti.field(ti.f32, (), needs_grad=True)
            x.from_numpy(_points(N, 3))
            run = (tinn.ad.gradient_stage if second else tinn.ad.stage)(model.network, x, out)

            @ti.kernel
            def user_loss():
                for i in out:
                    loss[None] += (out[i].norm() - 1.0) ** 2 / N

            def call():
                model.network.zero_grad()
                with ti.ad.Tape(loss=loss):
                    run()
                    user_loss()
                model.trainer.optimizer_step()
            return call
        return build
    if name == "backward_backward_input":
        def build():
            model = tinn.create_from_config(3, 1, _configs(True))
            x = _points(N, 3)
            ones = np.ones((N, 1), np.float32)

            def call():
                _, ctx = model.network.forward(x)
                model.network.backward_backward_input(ctx, x, ones)
            return call
        return build
    if name in ("torch", "torch_second_order"):
        import torch
        import tinn.torch as tcnn
        second = name == "torch_second_order"

        def build():
            config = _configs(second)
            model = tcnn.NetworkWithInputEncoding(3, 1, config["encoding"], config["network"])
            x = torch.from_numpy(_points(N, 3))

            def call():
                xg = x.clone().requires_grad_(second)
                y = model(xg)
                if second:
                    g, = torch.autograd.grad(y.sum(), xg, create_graph=True)
                    ((g.norm(dim=1) - 1) ** 2).mean().backward()
                else:
                    y.float().pow(2).mean().backward()
            return call
        return build
    raise ValueError(name)


def run_case(name, arch):
    """The case's figures, in its own process (printed as one JSON line)."""
    if name == "startup":
        out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "mlp_learning_an_image.py"), "--steps", "1",
                              "--arch", arch, "--out", tempfile.mkdtemp(prefix="tinn_startup_")],
                             capture_output=True, text=True, check=True).stdout
        line = next(l for l in out.splitlines() if l.startswith("Start-up"))
        return {"startup": float(line.split(":")[1].split()[0])}
    import taichi as ti
    counter = _Kernels()
    if name == "ti_init":
        ti.init(arch=getattr(ti, arch))
        return {"start": time.perf_counter() - T0}
    import tinn
    if name.startswith("torch"):
        import tinn.torch  # noqa: F401  (torch's own import counts in ``start``)
    tinn.init(getattr(ti, arch))
    start = time.perf_counter() - T0
    if name in SECOND:                  # the first model of the config, before the clock
        _case("train")()()
        counter.count, counter.ast = 0, 0.0
    t, c = time.perf_counter(), time.process_time()
    call = _case(name)()
    build = time.perf_counter() - t
    t = time.perf_counter()
    call()
    first, first_cpu = time.perf_counter() - t, time.process_time() - c
    kernels, ast = counter.count, counter.ast
    t, c = time.perf_counter(), time.process_time()
    call()
    again, again_cpu = time.perf_counter() - t, time.process_time() - c
    return {"start": start, "build": build, "first": first, "again": again, "compile": build + first - again,
            "ccpu": first_cpu - again_cpu, "kernels": kernels, "ast": ast}


# -- the driver ------------------------------------------------------------------------------------
def measure(name, cache, arch):
    env = dict(os.environ, TI_OFFLINE_CACHE_FILE_PATH=cache, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    t, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, __file__, "--child", name, "--arch", arch], env=env,
                         capture_output=True, text=True)
    wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise RuntimeError(f"case {name} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall"] = wall
    result["cpu"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return result


def fmt(r, key):
    v = r.get(key)
    return "–" if v is None else f"{v:d}" if isinstance(v, int) else f"{v:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--arch", default="cpu")
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_case(args.child, args.arch)))
        return
    results = {}
    keys = ("start", "build", "first", "again", "compile", "ccpu", "kernels", "ast", "wall", "cpu")
    print(f"{'case':26s} {'run':5s} " + " ".join(f"{k:>8s}" for k in keys) + "   (seconds; startup: the example's own line)")
    for name in args.cases:
        with tempfile.TemporaryDirectory(prefix="tinn_cache_") as cache:
            for run in ("cold", "warm"):
                r = results.setdefault(name, {})[run] = measure(name, cache, args.arch)
                if name == "startup":
                    print(f"{name:26s} {run:5s} start-up to first step done {r['startup']:.2f} s, "
                          f"wall {r['wall']:.2f} s, cpu {r['cpu']:.2f} s")
                else:
                    print(f"{name:26s} {run:5s} " + " ".join(f"{fmt(r, k):>8s}" for k in keys), flush=True)
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
