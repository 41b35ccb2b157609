"""Training ``tinn.torch`` modules across processes and machines with ``torch.distributed``.

Data parallel needs nothing from tinn: wrap a module in ``torch.nn.parallel.DistributedDataParallel``
(gloo on CPUs, NCCL where CUDA is available); each rank runs its share of the batch and DDP averages
``params.grad`` with an all-reduce (see ``examples/distributed_image.py``).

Network arrays are sharded by instance instead (:class:`ShardedArray`): rank r of N owns the contiguous
range ``shard_range(K, r, N)`` of the K networks, their parameters and (through the optimizer the user
builds over ``parameters()``) their optimizer state. A forward pass sends every sample to the rank that
owns its network with ``torch.distributed.all_to_all_single`` and brings the outputs back the same way;
the backward pass runs the two exchanges in reverse, so each rank's ``params.grad`` holds the gradient
of every rank's loss with respect to its own networks and no all-reduce is needed. Per step and rank
this moves ``4 (n_input_dims + n_output_dims) B_r`` bytes of samples and outputs, twice as much with
the backward pass, plus ``8 B_r`` bytes of network ids (B_r: the samples a rank sends or receives); see
``docs/scaling.md``.

Every rank must call forward and backward in the same order (they are collective), with inputs that
either all or none require grad.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ..runtime.rng import Pcg32
from .modules import Module


def shard_range(n_instances: int, rank: int, world_size: int) -> tuple[int, int]:
    """The networks ``[lo, hi)`` that ``rank`` owns: contiguous, sizes differing by at most one."""
    return n_instances * rank // world_size, n_instances * (rank + 1) // world_size


class _AllToAll(torch.autograd.Function):
    """Rows of ``x`` sent to ranks in ``send`` counts, received in ``recv`` counts; the backward pass sends
    the gradients back along the same routes."""

    @staticmethod
    def forward(ctx, x, send: list, recv: list, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def _exchange(x: torch.Tensor, send: list, recv: list, group) -> torch.Tensor:
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


class ShardedArray(torch.nn.Module):
    """A network array of ``n_instances`` networks split by instance over the ranks of ``group``.

    ``ShardedArray(tinn.torch.NetworkWithInputEncoding, 2, 3, encoding_config, network_config,
    n_instances=K, seed=1337)`` builds, on each rank, the module class with the arguments given and
    ``n_instances`` = the rank's share; network k starts from the parameters it has in an unsharded array
    (``pcg32(seed, seq=k + 1)``), so training over N ranks equals training the whole array in one process.
    ``module(x, instance=ids)`` takes the rank's own samples with global network ids and returns their
    outputs in the same order.
    """

    def __init__(self, module_class: type[Module], *args, n_instances: int, seed: int = 1337, group=None, **kwargs):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("ShardedArray needs torch.distributed.init_process_group(...) first")
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        if n_instances < self.world_size:
            raise ValueError(f"n_instances ({n_instances}) must be at least the number of ranks ({self.world_size})")
        self.n_instances = n_instances
        self.bounds = [shard_range(n_instances, r, self.world_size)[0] for r in range(self.world_size)] + [n_instances]
        self.lo, self.hi = self.bounds[self.rank], self.bounds[self.rank + 1]
        self.local = module_class(*args, seed=seed, n_instances=self.hi - self.lo, **kwargs)
        native = self.local.native_tcnn_module
        first = native.object.initial_params(Pcg32(seed, seq=np.arange(self.lo + 1, self.hi + 1)))
        with torch.no_grad():
            self.local.params.copy_(torch.from_numpy(first).reshape(self.local.params.shape))
        self.n_input_dims, self.n_output_dims = self.local.n_input_dims, self.local.n_output_dims

    def forward(self, x: torch.Tensor, instance) -> torch.Tensor:
        device = x.device
        ids = torch.as_tensor(instance, device=device)
        if ids.is_floating_point() or ids.shape != (x.shape[0],):
            raise ValueError(f"instance must be ({x.shape[0]},) integers, got {ids.dtype} {tuple(ids.shape)}")
        ids = ids.to(torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.n_instances):
            raise ValueError(f"instance ids must lie in [0, {self.n_instances})")
        owner = torch.bucketize(ids, torch.tensor(self.bounds[1:-1], device=device), right=True)
        order = torch.argsort(owner, stable=True)
        send = torch.bincount(owner, minlength=self.world_size)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        send, recv = send.tolist(), recv.tolist()
        x_in = _AllToAll.apply(x[order], send, recv, self.group)
        ids_in = _exchange(ids[order], send, recv, self.group) - self.lo
        if x_in.shape[0]:
            y_local = self.local(x_in, instance=ids_in)
        else:             # nothing to compute here, but the exchanges of the backward pass need this rank too
            anchor = self.local.params.sum().to(device) + x_in.sum()
            y_local = x_in.new_zeros((0, self.n_output_dims)) + 0 * anchor
        y_back = _AllToAll.apply(y_local, recv, send, self.group)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order), device=device)
        return y_back[inverse]

    def extra_repr(self):
        return f"n_instances={self.n_instances}, rank={self.rank}, owns=[{self.lo}, {self.hi})"
