"""``examples/nerf.py --compare``: KiloNeRF's claim measured in one run.

KiloNeRF (Reiser et al. 2021) renders faster than one large network by routing each sample, by its position,
to the tiny network of its cell. Here one field of ``nerf.py`` (one hash grid + 64-wide MLPs) and one of
``--instances K`` micro-networks (32-wide MLPs, tables sized so that the K networks hold about as many
parameters as the one) are trained on the same ray batches, interleaved ``LOSS_EVERY`` steps at a time (so a
loaded machine slows both alike): the one network for ``--steps`` steps, the array for as long in seconds.
Step 1 of each (mostly compiling) is timed apart and not counted as training. Then both render every held-out
view, view by view in turn, after one warm-up view each.

Prints a side-by-side table and writes ``nerf_compare.json`` and ``nerf_compare.png`` (one held-out view:
the target and both renders, each titled) into ``--out``.
"""
import json
import math
import os
import time

import numpy as np

import nerf_data
from _curves import titled
from _progress import Progress

MIN_WIDTH = 300                                         # a view in the picture is enlarged to this width


def _train_interleaved(args, fields, data):
    """Train ``fields = (one, array)``: the one network to ``--steps``, the array until it has trained as
    long; each time the field that has trained less goes next. Their training logs."""
    from nerf import LOSS_EVERY
    logs = [nerf_data.TrainingLog(None, clock=lambda f=f: f.seconds, show=False) for f in fields]
    one, array = fields
    for f, log in zip(fields, logs):                    # step 1 of each: compiling, timed apart
        start = time.perf_counter()
        f.train(1, data, log)
        f.first_step_s, f.seconds = time.perf_counter() - start, 0.0
    progress = Progress(None, "training both", every=5.0)
    while one.step < args.steps or array.seconds < one.seconds:
        k = 0 if one.step < args.steps and one.seconds <= array.seconds else 1
        steps = min(LOSS_EVERY, args.steps - one.step) if k == 0 else LOSS_EVERY
        if k == 1 and one.step >= args.steps:           # the array's last steps: those that fit the time left
            per_step = array.seconds / max(array.step - 1, 1)
            steps = min(steps, max(1, math.ceil((one.seconds - array.seconds) / max(per_step, 1e-9))))
        fields[k].train(steps, data, logs[k])
        shown = {_name(f): f"{f.step} steps ({f.seconds:.0f} s) PSNR {log.train_psnr:.2f}dB"
                 for f, log in zip(fields, logs)}
        progress.update(one.step + array.step, **shown)
    return logs


def _name(field):
    return "one network" if field.instances == 1 else f"{field.instances} networks"


def _render_interleaved(fields, test):
    """Every held-out view rendered by each field in turn (after a warm-up view each): the renders
    ``(N, H, W, 3)`` and the seconds of each view, per field."""
    for f in fields:
        f.render_images(test.c2w[:1], test)
    images, seconds = [[] for _ in fields], [[] for _ in fields]
    rendering = Progress(test.n, "rendering the held-out views with both")
    for v in range(test.n):
        for k, f in enumerate(fields):
            start = time.perf_counter()
            images[k].append(f.render_images(test.c2w[v:v + 1], test)[0])
            seconds[k].append(time.perf_counter() - start)
        rendering.update(v + 1)
    return [np.stack(i) for i in images], [np.array(s) for s in seconds]


def compare_picture(test, renders, results, view=0):
    """Held-out view ``view``: the target and each field's render side by side (enlarged to ``MIN_WIDTH``),
    each titled with its PSNR on that view, under the training times and parameter counts of both."""
    def big(img):
        return nerf_data.enlarged(nerf_data.to_uint8(img), MIN_WIDTH)
    panels = [titled(big(test.images[view]), f"HELD-OUT VIEW {view} (TARGET)")]
    for name, r in zip(results, renders):
        panels.append(titled(big(r[view]), f"{name}: {nerf_data.psnr(r[view], test.images[view]):.2f} DB"))
    gap = np.full((panels[0].shape[0], 12, 3), 255, np.uint8)
    row = np.concatenate([p for panel in panels for p in (panel, gap)][:-1], 1)
    one, array = results.values()
    sizes = f"TRAINING TIME {one['train_s']:.0f} / {array['train_s']:.0f} S, PARAMETERS {one['n_params']} / " \
            f"{array['n_params']}"
    return titled(titled(row, sizes), "ONE NETWORK AGAINST A KILONERF-STYLE ARRAY, SAME VIEW")


def compare(args, train, test, Field):
    """Train and evaluate one network and ``args.instances`` micro-networks (module docstring); the results."""
    fields = (Field(args, 1), Field(args, args.instances))
    print(f"{train.n} training views, {test.n} held-out views at {train.width}x{train.height}")
    for f in fields:
        print(f"  {_name(f)}: {f.describe()}")
    print(f"  parameters, array / one: {fields[1].n_params / fields[0].n_params:.3f}")
    logs = _train_interleaved(args, fields, train.rays())
    renders, seconds = _render_interleaved(fields, test)
    results = {}
    for f, log, r, s in zip(fields, logs, renders, seconds):
        results[_name(f).upper()] = dict(
            n_networks=f.instances, n_params=f.n_params, steps=f.step, train_s=f.seconds,
            first_step_s=f.first_step_s, steps_per_s=(f.step - 1) / f.seconds, psnr=nerf_data.psnr(r, test.images),
            render_s_per_view=float(np.median(s)), psnr_reached_at_s={str(m): t for m, t in log.reached.items()})
    one, array = results.values()
    rows = [("networks", "n_networks", "{}"), ("parameters", "n_params", "{}"), ("training steps", "steps", "{}"),
            ("training time, s (after step 1)", "train_s", "{:.1f}"),
            ("step 1 (compiling), s", "first_step_s", "{:.1f}"),
            ("training steps per second", "steps_per_s", "{:.2f}"), ("held-out PSNR, dB", "psnr", "{:.2f}"),
            ("render time per held-out view, s (median)", "render_s_per_view", "{:.3f}")]
    names = list(results)
    print(f"\n{'':44}{names[0].lower():>16}{names[1].lower():>16}")
    for label, key, fmt in rows:
        print(f"{label:44}{fmt.format(one[key]):>16}{fmt.format(array[key]):>16}")
    print(f"array / one: render speed {one['render_s_per_view'] / array['render_s_per_view']:.2f}x, "
          f"training steps per second {array['steps_per_s'] / one['steps_per_s']:.2f}x, "
          f"held-out PSNR {array['psnr'] - one['psnr']:+.2f} dB (mean-colour baseline "
          f"{nerf_data.psnr(test.images.mean((0, 1, 2)), test.images):.2f} dB)")
    import imageio.v2 as imageio
    picture = os.path.join(args.out, "nerf_compare.png")
    imageio.imwrite(picture, compare_picture(test, renders, results))
    summary = os.path.join(args.out, "nerf_compare.json")
    with open(summary, "w") as fh:
        json.dump({"one": one, "array": array}, fh, indent=1)
    print(f"wrote {picture}\nwrote {summary}")
    return results
