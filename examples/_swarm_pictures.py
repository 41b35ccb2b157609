"""The pictures of ``examples/swarm.py``, drawn with numpy (written with imageio): the objective of each learner
during training in one labelled chart, and the agents' paths and a GIF of their run, a titled panel per learner.

Agents are coloured by the direction of their goal; obstacles are grey discs; in the paths picture a square in
an agent's colour marks its goal and a black dot where it ended.
"""
import os

import numpy as np

from _curves import Series, draw_series, titled

TITLES = {"array": "ARRAY: A NETWORK PER AGENT", "shared": "ONE SHARED NETWORK, NO ID",
          "shared_with_id": "ONE SHARED NETWORK + ID"}


def colours(goal):
    """A colour per agent from the direction of its goal (a hue wheel)."""
    hue = (np.arctan2(goal[:, 1] - 0.5, goal[:, 0] - 0.5) / (2 * np.pi)) % 1.0
    k = (hue[:, None] * 6 + np.array([5, 3, 1])) % 6
    return (255 * (1 - np.clip(np.minimum(k, 4 - k), 0, 1) * 0.8)).astype(np.uint8)


def canvas(size, obstacles):
    img = np.full((size, size, 3), 255, np.uint8)
    yy, xx = (np.mgrid[0:size, 0:size] + 0.5) / size
    for x, y, r in obstacles:
        img[(xx - x) ** 2 + (1 - yy - y) ** 2 < r ** 2] = 90
    return img


def dots(img, points, rgb, radius=1):
    size = img.shape[0]
    px = np.clip((points[:, 0] * size).astype(int), 0, size - 1)
    py = np.clip(((1 - points[:, 1]) * size).astype(int), 0, size - 1)
    for dy in range(-radius + 1, radius):
        for dx in range(-radius + 1, radius):
            img[np.clip(py + dy, 0, size - 1), np.clip(px + dx, 0, size - 1)] = rgb


def trajectory_picture(paths, goal, rgb, obstacles, size=384, sub=6, shown=32):
    """The paths of ``shown`` agents (every k-th), each step drawn as ``sub`` points along its segment, each
    one's goal (a square in its colour) and where it ended (a black dot: on its square when it arrived)."""
    img = canvas(size, obstacles)
    pick = slice(None, None, max(1, paths.shape[1] // shown))
    for t in range(len(paths) - 1):
        for s in range(sub):
            dots(img, (paths[t] + (paths[t + 1] - paths[t]) * s / sub)[pick], rgb[pick], radius=2)
    dots(img, goal[pick], rgb[pick], radius=5)
    dots(img, paths[-1][pick], 0, radius=3)
    return img


def side_by_side(panels, titles):
    """Titled panels in a row, 8 white pixels apart."""
    row = [titled(img, title) for img, title in zip(panels, titles)]
    gap = np.full((row[0].shape[0], 8, 3), 255, np.uint8)
    return np.concatenate([x for img in row for x in (gap, img)][1:], 1)


def save_pictures(out, results, goal, obstacles):
    """``swarm_curves.png``, ``swarm_trajectories.png`` and ``swarm.gif`` of ``{learner: result}``; their paths."""
    import imageio.v2 as imageio
    rgb, names = colours(goal), list(results)
    titles = [f"{TITLES[n]} ({results[n]['n_params']} PARAMS)" for n in names]
    curves = os.path.join(out, "swarm_curves.png")
    imageio.imwrite(curves, draw_series("OBJECTIVE (LOG) DURING TRAINING", [
        Series(TITLES[n], np.arange(len(results[n]["curve"])), results[n]["curve"]) for n in names], log=True))
    path = os.path.join(out, "swarm_trajectories.png")
    paths = [trajectory_picture(results[n]["paths"], goal, rgb, obstacles) for n in names]
    imageio.imwrite(path, side_by_side(paths, titles))
    frames = []
    for t in range(len(results[names[0]]["paths"])):
        panels = []
        for n in names:
            panels.append(canvas(256, obstacles))
            dots(panels[-1], results[n]["paths"][t], rgb, radius=2)
        frames.append(side_by_side(panels, [TITLES[n] for n in names]))
    gif = os.path.join(out, "swarm.gif")
    imageio.mimsave(gif, frames, duration=0.1, loop=0)
    return curves, path, gif
