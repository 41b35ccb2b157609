"""The multilayer perceptron behind tcnn's ``FullyFusedMLP`` and ``CutlassMLP`` (spec §2).

Keys (defaults): ``n_neurons`` H (128), ``n_hidden_layers`` NL (5), ``activation``
("ReLU"), ``output_activation`` ("None"). No biases::

    h_0 = x,   h_k = act(W_{k-1} h_{k-1}) for k = 1..NL,   y = out_act(W_NL h_NL)

``W_0`` is H x n_in, the hidden matrices H x H, ``W_NL`` P x H with P = the output
width padded to 16 (NL = 0: one P x n_in matrix). Parameters are the matrices in that
order, each row-major. Initialisation is Xavier uniform per matrix,
``U(-s, s)``, ``s = sqrt(6 / (fan_in + fan_out))``; with ``activation = "Sine"``,
``s = 30 / fan_in`` for W_0 and ``sqrt(6 / fan_in)`` after (SIREN).

Backward: ``delta_NL+1 = out_act'(z) * dL/dy``, ``dL/dW_k = delta_{k+1}^T h_k`` summed
over the batch, ``delta_k = act'(z_k) * (delta_{k+1} W_k)``, ``dL/dx = delta_1 W_0``.

One implementation serves both otypes and any width or depth (tinn has no
tensor-core width rule). Batches run on the host: samples are grouped per network, cut
into cache-sized blocks, and each block goes through every layer (numpy's BLAS for the
products, the activation applied while the block is in cache) on tinn's worker threads. When a
batch reaches every network of a large array, the products read the weights and write the gradients
in the parameter store's own memory (``ParamStore.rows_view``) instead of copies.
Of the padded rows of ``W_NL`` beyond ``n_output_dims`` at most 3 are computed: the padding
outputs get no gradient, so those rows' gradients are zero, as in tcnn.
"""

import numpy as np
import taichi as ti

from .. import _blas
from ..config import Options, networks
from ..object import Context
from ..routing import Groups
from . import activations
from .network import Network

ROWS_PER_BLOCK = 4096
"""Samples per block of the host path: few enough that a block's activations stay in cache (L2/L3),
many enough that numpy's per-call cost and the threads' turns at the GIL stay small (measured on a
2-core Zen 3: 4096 beat 512, 1024, 2048 and 8192 by 5-40 %)."""


class _Blocks:
    """How a ``(R, S, n)`` stack of grouped samples (``routing.Groups``) is cut into blocks for tinn's
    BLAS workers: along the samples (worker-private weight-gradient sums) when row blocks are few and
    large, else along whole row blocks (each one's gradient written once)."""

    def __init__(self, groups: Groups):
        self.n_rows, self.size = groups.n_rows, groups.size
        self.by_rows = self.size >= ROWS_PER_BLOCK or self.n_rows < _blas.n_workers()

    def run(self, fn):
        """``fn(worker, index)`` per block; ``index`` selects the block in a ``(R, S, ...)`` stack."""
        if self.by_rows:
            _blas.for_blocks(self.size, ROWS_PER_BLOCK, lambda w, lo, hi: fn(w, (slice(None), slice(lo, hi))))
        else:
            per_block = max(1, ROWS_PER_BLOCK // self.size)
            _blas.for_blocks(self.n_rows, per_block, lambda w, lo, hi: fn(w, (slice(lo, hi),)))

    def rows(self, index):
        """The row blocks (and so the weights) a block touches (all of them when cut along the samples)."""
        return index[:1]


@networks.register("CutlassMLP", "MLP", "FullyFusedMLP", "MegakernelMLP")
class MLP(Network):
    def __init__(self, n_input_dims: int, n_output_dims: int, *, n_neurons: int = 128, n_hidden_layers: int = 5,
                 activation: str = "ReLU", output_activation: str = "None", otype: str = "CutlassMLP",
                 n_instances: int = 1, seed: int = 1337):
        super().__init__(n_input_dims, n_output_dims, n_instances=n_instances, seed=seed)
        self.otype, self.n_neurons, self.n_hidden_layers = otype, n_neurons, n_hidden_layers
        self.activation, self.output_activation = activation, output_activation
        widths = [n_input_dims] + [n_neurons] * n_hidden_layers + [self.padded_output_width]
        self._layers = list(zip(widths[1:], widths[:-1]))          # (rows, cols) per matrix
        self.n_params = sum(r * c for r, c in self._layers)

    @classmethod
    def from_config(cls, n_input_dims, n_output_dims, config, *, otype="CutlassMLP", **kwargs):
        opt = Options("network", otype, config)
        canonical = "FullyFusedMLP" if otype.lower() in ("fullyfusedmlp", "megakernelmlp") else "CutlassMLP"
        net = cls(n_input_dims, n_output_dims, otype=canonical,
                  n_neurons=opt.get("n_neurons", 128, int, check=lambda v: v >= 1, rule="must be >= 1"),
                  n_hidden_layers=opt.get("n_hidden_layers", 5, int, check=lambda v: v >= 0, rule="must be >= 0"),
                  activation=opt.get("activation", "ReLU", str, choices=activations.NAMES),
                  output_activation=opt.get("output_activation", "None", str, choices=activations.NAMES),
                  **kwargs)
        opt.used.update({"n_input_dims", "n_output_dims"})
        opt.done()
        return net

    def hyperparams(self):
        return {"otype": self.otype, "n_neurons": self.n_neurons, "n_hidden_layers": self.n_hidden_layers,
                "activation": self.activation, "output_activation": self.output_activation}

    def layer_sizes(self):
        return list(self._layers)

    def initial_params(self, rng):
        blocks = []
        for i, (rows, cols) in enumerate(self._layers):
            if self.activation == "Sine":
                s = 30.0 / cols if i == 0 else np.sqrt(6.0 / cols)
            else:
                s = np.sqrt(6.0 / (rows + cols))
            s = np.float32(s)
            blocks.append(rng.draws(rows * cols) * (s * np.float32(2)) - s)
        return np.concatenate(blocks, axis=-1)

    # -- one sample inside a user's kernel -----------------------------------------
    @property
    def func(self):
        """``ti.func (x: ti.Vector[n_input_dims], instance=0) -> ti.Vector[n_output_dims]`` for user
        kernels; reads the inference weights, as ``inference()`` does."""
        return self._sample_funcs(self.store.inference_params)[0]

    @property
    def backward_func(self):
        """``ti.func (x, dL_dy, instance=0) -> dL_dx`` through the training weights; adds the parameter
        gradients (atomically)."""
        return self._sample_funcs(self.store.params)[1]

    def _sample_funcs(self, weights):
        cache = self.__dict__.setdefault("_funcs", {})
        if weights not in cache:
            cache[weights] = sample_funcs(self, weights)
        return cache[weights]

    # -- batch API ---------------------------------------------------------------
    def _split(self, flat):
        """``(..., n_params)`` -> one ``(..., rows, cols)`` view per matrix."""
        out, start = [], 0
        for rows, cols in self._layers:
            out.append(flat[..., start:start + rows * cols].reshape(flat.shape[:-1] + (rows, cols)))
            start += rows * cols
        return out

    def _matrices(self, groups: Groups, field):
        """Weights of the grouped networks, one ``(R, rows, cols)`` array per layer, a row per row block
        of the stack (in place where the store allows, else a copy)."""
        flat = self.store.rows_view(field, self._offset, self.n_params, groups.active)
        return self._split(groups.per_row(self.store.read_rows(field, self._offset, self.n_params, groups.active)
                                          if flat is None else flat))

    def _act(self, layer: int) -> str:
        return self.output_activation if layer == len(self._layers) - 1 else self.activation

    def _used(self, weights):
        """The weights the batch path computes with. Rows of W_NL beyond n_output_dims only ever meet
        zero output gradients (the padding is not part of any output), so only the first
        ``next_multiple(n_output_dims, 4)`` are computed (BLAS runs 4 rows faster than 3)."""
        return weights[:-1] + [weights[-1][:, : min(self.padded_output_width, -(-self.n_output_dims // 4) * 4)]]

    def _run(self, x, instance, keep: bool):
        groups = Groups(instance, self.n_instances, x.shape[0])
        weights = self._used(self._matrices(groups, self.store.params if keep else self.store.inference_params))
        blocks, n = _Blocks(groups), len(weights)
        G, S = groups.n_rows, groups.size
        acts = [self._act(i) for i in range(n)]
        hs = [groups.gather(x)] + [np.empty((G, S, w.shape[1]), np.float32) if keep or i == n - 1 else None
                                   for i, w in enumerate(weights)]
        zs = [np.empty_like(hs[i + 1]) if keep and acts[i] not in activations.FROM_OUTPUT else None
              for i in range(n)]

        def block(worker, index):
            sel = blocks.rows(index)
            h = hs[0][index]
            for i, w in enumerate(weights):
                in_place = acts[i] in activations.FROM_OUTPUT
                target = hs[i + 1] if in_place else zs[i]
                z = np.matmul(h, w[sel].transpose(0, 2, 1), out=None if target is None else target[index])
                h = activations.host_value(acts[i], z)
                if not in_place and hs[i + 1] is not None:
                    hs[i + 1][index] = h

        blocks.run(block)
        y = groups.scatter(hs[-1])
        ctx = Context(self, x, instance, groups=groups, blocks=blocks, weights=weights, zs=zs, hs=hs) if keep else None
        return y, ctx

    def _inference(self, x, instance):
        return self._run(x, instance, keep=False)[0]

    def _forward(self, x, instance):
        return self._run(x, instance, keep=True)

    def _backward(self, ctx, dL_dy, input_gradient, overwrite=False):
        groups, blocks, weights, zs, hs = ctx.groups, ctx.blocks, ctx.weights, ctx.zs, ctx.hs
        n, G = len(weights), groups.n_rows
        g_all = groups.gather(np.ascontiguousarray(dL_dy[:, : weights[-1].shape[1]]))
        dx = np.empty_like(hs[0]) if input_gradient else None
        workers = _blas.n_workers() if blocks.by_rows else 1
        # dL/dW in tcnn's layout: summed per worker when cut along the samples, else written once per
        # network (straight into the store's gradients where it allows), all but the output rows that
        # are not computed (their gradient is 0, as in tcnn); a network cut into several row blocks
        # sums its blocks' gradients
        store = self.store
        direct = overwrite and not blocks.by_rows and groups.row_group is None
        target = store.rows_view(store.grads, self._offset, self.n_params, groups.active) if direct else None
        flat = target[None] if target is not None else (np.zeros if blocks.by_rows else np.empty)(
            (workers, G, self.n_params), np.float32)
        dWs = self._split(flat)
        dWs[-1][:, :, weights[-1].shape[1]:] = 0.0

        acts = [self._act(i) for i in range(n)]
        derivative_of = [hs[i + 1] if acts[i] in activations.FROM_OUTPUT else zs[i] for i in range(n)]

        def block(worker, index):
            sel = blocks.rows(index)
            g = g_all[index].copy()
            for i in reversed(range(n)):
                activations.host_times_derivative(acts[i], derivative_of[i][index], g)
                dW = dWs[i][worker if blocks.by_rows else 0][sel][:, : g.shape[2]]
                if blocks.by_rows:
                    dW += np.matmul(g.transpose(0, 2, 1), hs[i][index])
                else:
                    np.matmul(g.transpose(0, 2, 1), hs[i][index], out=dW)
                if i > 0 or input_gradient:
                    g = np.matmul(g, weights[i][sel], out=dx[index] if i == 0 else None)

        blocks.run(block)
        if target is None:
            flat = groups.sum_rows(flat, axis=1)
            (store.write_rows if overwrite else store.add_rows)(store.grads, self._offset, groups.active,
                                                                flat.sum(axis=0) if workers > 1 else flat[0])
        return groups.scatter(dx) if input_gradient else None


def sample_funcs(mlp: MLP, weights):
    """Per-sample forward and backward ``ti.func``s of ``mlp`` reading ``weights[instance, ...]``.

    Activations live in local buffers as wide as the widest layer, indexed dynamically, so
    only the (few) layers are unrolled. The backward recomputes the forward pass and adds
    ``dL/dW`` to the gradients atomically (user kernels run samples in parallel).
    """
    grads, base = mlp.store.grads, mlp._offset
    sizes = mlp.layer_sizes()
    offsets = [base + sum(r * c for r, c in sizes[:i]) for i in range(len(sizes))]
    layers = sizes[:-1] + [(mlp.n_output_dims, sizes[-1][1])]    # the padded output rows are not computed
    acts = [mlp._act(i) for i in range(len(layers))]
    n_in, n_out, width = mlp.n_input_dims, mlp.n_output_dims, max(max(r, c) for r, c in layers)
    n_layers = len(layers)

    @ti.func
    def layer(k, inputs, li: ti.template()):
        """Pre-activations ``W_li inputs`` of layer li."""
        rows, cols, off = ti.static(layers[li][0], layers[li][1], offsets[li])
        pre = ti.Vector.zero(ti.f32, width)
        for r in range(rows):
            acc = 0.0
            for c in range(cols):
                acc += weights[k, off + r * cols + c] * inputs[c]
            pre[r] = acc
        return pre

    @ti.func
    def activate(pre, li: ti.template()):
        post = ti.Vector.zero(ti.f32, width)
        for r in range(layers[li][0]):
            post[r] = activations.value(acts[li], pre[r])
        return post

    @ti.func
    def head(v, n: ti.template()):
        """The first n entries of a buffer (Taichi 1.7 resolves names in comprehensions
        inside inlined funcs unreliably, so results are copied out explicitly)."""
        out = ti.Vector.zero(ti.f32, n)
        for i in ti.static(range(n)):
            out[i] = v[i]
        return out

    @ti.func
    def func(x, k=0):
        h = ti.Vector.zero(ti.f32, width)
        for i in ti.static(range(n_in)):
            h[i] = x[i]
        for li in ti.static(range(n_layers)):
            h = activate(layer(k, h, li), li)
        return head(h, n_out)

    @ti.func
    def backward_func(x, dy, k=0):
        hs = ti.Matrix.zero(ti.f32, n_layers, width)        # input of each layer
        zs = ti.Matrix.zero(ti.f32, n_layers, width)        # pre-activation of each layer
        h = ti.Vector.zero(ti.f32, width)
        for i in ti.static(range(n_in)):
            h[i] = x[i]
        for li in ti.static(range(n_layers)):
            z = layer(k, h, li)
            for c in range(width):
                hs[li, c], zs[li, c] = h[c], z[c]
            h = activate(z, li)
        g = ti.Vector.zero(ti.f32, width)
        for i in ti.static(range(n_out)):
            g[i] = dy[i]
        for li in ti.static(list(reversed(range(n_layers)))):
            rows, cols, off = ti.static(layers[li][0], layers[li][1], offsets[li])
            for r in range(rows):
                g[r] *= activations.derivative(acts[li], zs[li, r])
            below = ti.Vector.zero(ti.f32, width)
            for r in range(rows):
                for c in range(cols):
                    ti.atomic_add(grads[k, off + r * cols + c], g[r] * hs[li, c])
                    below[c] += weights[k, off + r * cols + c] * g[r]
            g = below
        return head(g, n_in)

    return func, backward_func

