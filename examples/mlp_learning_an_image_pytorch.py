#!/usr/bin/env python3
"""Learn a 2-D image through tinn's PyTorch modules: tiny-cuda-nn's ``mlp_learning_an_image_pytorch.py``.

    python examples/mlp_learning_an_image_pytorch.py [IMAGE] [CONFIG] [--steps N] [--batch B] [--out DIR]

The same workload as ``mlp_learning_an_image.py``, written as a tinycudann user writes it: the image is
a ``torch.nn.Module`` doing a bilinear lookup in torch, the model is ``tinn.torch.NetworkWithInputEncoding``
(tinycudann's class), and training is ``model(batch)``, a relative L2 loss in torch, ``loss.backward()``
and ``torch.optim.Adam`` with the config's learning rate, betas and epsilon. Snapshots and PSNRs as the
native example (steps 10, 100, 1000, then every 1000, and the last step).
"""
import argparse
import os
import time

import numpy as np

from _progress import Progress  # noqa: E402
from mlp_learning_an_image import (DEFAULT_CONFIG, DEFAULT_IMAGE, is_snapshot, load_image, pixel_centres, psnr,
                                   check_image_and_config, write_jpg)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("image", nargs="?", default=DEFAULT_IMAGE, help="image to learn")
    ap.add_argument("config", nargs="?", default=DEFAULT_CONFIG,
                    help="tcnn JSON config file, or the name of a config shipped with tinn")
    ap.add_argument("--steps", type=int, default=1000, help="training steps")
    ap.add_argument("--batch", type=int, default=1 << 16, help="samples per step")
    ap.add_argument("--out", default=os.path.join("out", "pytorch"), help="folder for the snapshots")
    ap.add_argument("--seed", type=int, default=1337, help="seed of the parameters and of the sampled batches")
    ap.add_argument("--arch", default="cpu", help="Taichi arch (cpu, cuda, vulkan, metal, ...)")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch's CPU threads (its share of a step is small; tinn's own threads do the rest)")
    args = ap.parse_args(argv)
    check_image_and_config(ap, args)
    return args


if __name__ == "__main__":      # --help and argument errors are answered before torch and Taichi load
    ARGS = parse_args()

import taichi as ti  # noqa: E402
import torch  # noqa: E402

import tinn  # noqa: E402
import tinn.torch as tcnn  # noqa: E402


class Image(torch.nn.Module):
    """Bilinearly filtered lookups in an (H, W, 3) image at (x right, y down) in [0, 1]^2; pixel centres at
    ((i + 0.5) / W, (j + 0.5) / H), clamped at the edges (as the native example's kernel)."""

    def __init__(self, data: np.ndarray, device):
        super().__init__()
        self.data = torch.from_numpy(data).float().to(device)
        self.shape = self.data.shape

    def forward(self, xs):
        with torch.no_grad():
            h, w = self.shape[0], self.shape[1]
            p = xs * torch.tensor([w, h], device=xs.device, dtype=xs.dtype) - 0.5
            corner = p.floor()
            t = p - corner
            x0, y0 = corner[:, 0].long(), corner[:, 1].long()
            x1, y1 = (x0 + 1).clamp(0, w - 1), (y0 + 1).clamp(0, h - 1)
            x0, y0 = x0.clamp(0, w - 1), y0.clamp(0, h - 1)
            tx, ty = t[:, 0:1], t[:, 1:2]
            top = self.data[y0, x0] * (1 - tx) + self.data[y0, x1] * tx
            bottom = self.data[y1, x0] * (1 - tx) + self.data[y1, x1] * tx
            return top * (1 - ty) + bottom * ty


def main(args):
    tinn.init(arch=getattr(ti, args.arch))
    torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = tinn.load_config(args.config)
    image = Image(load_image(args.image), device)
    H, W, n_channels = image.shape
    os.makedirs(args.out, exist_ok=True)
    print(f"Image {args.image}: {W}x{H}; config {args.config}; batch {args.batch}, {args.steps} steps")

    model = tcnn.NetworkWithInputEncoding(n_input_dims=2, n_output_dims=n_channels, encoding_config=config["encoding"],
                                          network_config=config["network"], seed=args.seed).to(device)
    print(model)
    opt = config.get("optimizer", {})
    optimizer = torch.optim.Adam(model.parameters(), lr=opt.get("learning_rate", 1e-2),
                                 betas=(opt.get("beta1", 0.9), opt.get("beta2", 0.99)), eps=opt.get("epsilon", 1e-15))

    xy = torch.from_numpy(pixel_centres(H, W)).to(device)
    reference = image.data.cpu().numpy()
    write_jpg(os.path.join(args.out, "reference.jpg"), reference)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    snapshots, losses, t_train, last = [], [], 0.0, 0
    progress = Progress(args.steps, "training")
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        batch = torch.rand([args.batch, 2], device=device, dtype=torch.float32, generator=generator)
        targets = image(batch)
        output = model(batch)
        relative_l2_error = (output - targets.to(output.dtype)) ** 2 / (output.detach() ** 2 + 0.01)
        loss = relative_l2_error.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        t_train += time.perf_counter() - t0

        progress.update(step, loss=f"{losses[-1]:.5f}")
        if is_snapshot(step) or step == args.steps:
            progress.write(f"Step#{step}: loss={np.mean(losses):.6f} steps/s={(step - last) / t_train:.2f}")
            losses, t_train, last = [], 0.0, step
            with torch.no_grad():
                result = model(xy).reshape(H, W, n_channels).cpu().numpy()
            snapshots.append((step, psnr(result, reference)))
            write_jpg(os.path.join(args.out, f"{step}.jpg"), result)
    progress.close()

    print("PSNR against the reference:")
    for step, value in snapshots:
        print(f"  step {step:>7d}: {value:.2f} dB")
    print(f"Final PSNR: {snapshots[-1][1]:.2f} dB")
    tcnn.free_temporary_memory()


if __name__ == "__main__":
    main(ARGS)
