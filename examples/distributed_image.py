#!/usr/bin/env python3
"""Learn a 2-D image on several processes (or machines) with torch.distributed and tinn.torch.

    torchrun --nproc_per_node=N examples/distributed_image.py [IMAGE] [CONFIG] [--steps S] [--batch B]
    torchrun --nproc_per_node=N examples/distributed_image.py --instances K ...

Every step draws the same global batch of B coordinates on every rank (one seeded generator) and each
rank trains on its B/N share, so N processes take the same steps as one process with B samples:

* default, data parallel: one ``NetworkWithInputEncoding`` per rank inside
  ``DistributedDataParallel`` (an all-reduce of ``params.grad`` per step);
* ``--instances K``: a network array of K networks, one per horizontal band of the image, sharded by
  instance (``tinn.torch.distributed.ShardedArray``): each rank owns K/N networks and their Adam state,
  and samples travel to their network's rank and back with ``all_to_all_single``.

gloo on CPUs, NCCL where CUDA is available. ``--save PATH`` writes the final parameters (rank 0) so
runs with different N can be compared. Multi-machine: torchrun's ``--nnodes``/``--rdzv-endpoint``.
"""
import argparse
import os

import numpy as np

from _progress import Progress
from mlp_learning_an_image import (DEFAULT_CONFIG, DEFAULT_IMAGE, check_image_and_config, load_image, pixel_centres,
                                   psnr)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("image", nargs="?", default=DEFAULT_IMAGE, help="image to learn")
    ap.add_argument("config", nargs="?", default=DEFAULT_CONFIG,
                    help="tcnn JSON config file, or the name of a config shipped with tinn")
    ap.add_argument("--steps", type=int, default=200, help="training steps")
    ap.add_argument("--batch", type=int, default=1 << 16, help="global batch (all ranks together)")
    ap.add_argument("--instances", type=int, default=0, help="K > 0: a network array sharded over the ranks")
    ap.add_argument("--seed", type=int, default=1337, help="seed of the parameters and of the sampled batches")
    ap.add_argument("--save", default="", help="write the final parameters to this .npz file (rank 0; none if empty)")
    ap.add_argument("--arch", default="cpu", help="Taichi arch (cpu, cuda, vulkan, metal, ...)")
    args = ap.parse_args(argv)
    check_image_and_config(ap, args)
    return args


if __name__ == "__main__":      # --help and argument errors are answered before torch and Taichi load
    ARGS = parse_args()

import taichi as ti  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tinn  # noqa: E402
import tinn.torch as tcnn  # noqa: E402
from mlp_learning_an_image_pytorch import Image  # noqa: E402
from tinn.torch.distributed import ShardedArray  # noqa: E402


def main(args):
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} must be a multiple of the number of processes {world}")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    tinn.init(arch=getattr(ti, args.arch), cpu_max_num_threads=max(1, (os.cpu_count() or 1) // local_world),
              log_level=ti.WARN)
    torch.set_num_threads(1)

    config = tinn.load_config(args.config)
    image = Image(load_image(args.image), device)
    H, W, C = image.shape
    K = args.instances
    model_args = (2, C, config["encoding"], config["network"])
    if K:
        model = ShardedArray(tcnn.NetworkWithInputEncoding, *model_args, n_instances=K, seed=args.seed)

        def route(xy):                       # network k learns the k-th horizontal band of the image
            return (xy[:, 1] * K).long().clamp(max=K - 1)
    else:
        net = tcnn.NetworkWithInputEncoding(*model_args, seed=args.seed).to(device)
        model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if cuda else None)
    opt = config.get("optimizer", {})
    optimizer = torch.optim.Adam(model.parameters(), lr=opt.get("learning_rate", 1e-2),
                                 betas=(opt.get("beta1", 0.9), opt.get("beta2", 0.99)), eps=opt.get("epsilon", 1e-15))
    if rank == 0:
        print(f"{world} processes ({dist.get_backend()}), global batch {args.batch}, "
              + (f"{K} networks sharded by instance" if K else "data parallel (DDP)"))

    generator = torch.Generator(device=device).manual_seed(args.seed)
    share = args.batch // world
    progress = Progress(args.steps, "training (rank 0's share)") if rank == 0 else None
    for step in range(1, args.steps + 1):
        batch = torch.rand([args.batch, 2], device=device, generator=generator)[rank * share:(rank + 1) * share]
        targets = image(batch)
        output = model(batch, instance=route(batch)) if K else model(batch)
        error = (output - targets.to(output.dtype)) ** 2 / (output.detach() ** 2 + 0.01)
        # the global batch's mean: DDP averages the ranks' gradients, sharding adds them
        loss = error.sum() / (args.batch * C) if K else error.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress.update(step, loss=f"{loss.item():.5f}")
        if step in (1, 10, 100, args.steps) or step % 1000 == 0:
            total = loss.detach().clone()
            dist.all_reduce(total)
            if progress is not None:
                progress.write(f"Step#{step}: loss={float(total) / (1 if K else world):.6f}")
    if progress is not None:
        progress.close()

    with torch.no_grad():                    # every rank renders its share of the pixels (sharding needs all)
        xy = torch.from_numpy(pixel_centres(H, W)).to(device)
        mine = xy[rank * len(xy) // world:(rank + 1) * len(xy) // world]
        part = (model(mine, instance=route(mine)) if K else model.module(mine)).cpu().numpy()
    parts = [None] * world
    dist.all_gather_object(parts, part)
    if K:
        shards = [None] * world
        dist.all_gather_object(shards, model.local.params.detach().cpu().numpy().reshape(model.hi - model.lo, -1))
        params = np.concatenate(shards)
    else:
        params = model.module.params.detach().cpu().numpy()
    if rank == 0:
        print(f"Final PSNR: {psnr(np.concatenate(parts).reshape(H, W, C), image.data.cpu().numpy()):.2f} dB")
        if args.save:
            np.savez(args.save, params=params)
    # every rank done with every collective, and DDP's reducer (which holds gloo's last works) freed while the
    # interpreter is whole: a process group torn down at interpreter exit can abort the process
    dist.barrier()
    del model, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    main(ARGS)
