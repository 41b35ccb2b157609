"""``NetworkWithInputEncoding`` (tcnn ``network_with_input_encoding.h``): ``y = network(encoding(x))``.

The encoding is padded to a multiple of 16 (its padded dims act as a bias input to
the MLP: fill 1, or 0 for grids). Parameters are one buffer, network first, then
encoding, and are initialised in that order from one pcg32 generator.
"""
import numpy as np
import taichi as ti

from .keys import check_precision
from .networks.network import OUTPUT_ALIGNMENT
from .object import Context, DifferentiableObject
from .params import allocate, check_sizes
from .registry import build_encoding, build_network, load_config


class NetworkWithInputEncoding(DifferentiableObject):
    """``y = network(encoding(x))``: an encoding of ``n_input_dims`` inputs, padded to a multiple of 16,
    feeding a network with ``n_output_dims`` outputs (tcnn's ``NetworkWithInputEncoding``).

    ``encoding_config`` and ``network_config`` are tcnn config sections (dicts, or paths to JSON
    files); ``n_instances=K`` makes a network array (every batch then takes ``instance`` ids or a
    dense ``(K, B_k, n_input_dims)`` layout); ``seed`` draws the initial parameters. The whole
    model's parameters are one store, allocated here: ``params()`` is ``(n_params,)``, network
    matrices first, then the encoding's, as in tcnn. ``precision="float16"`` stores them (and the
    inference weights) in half precision, as tcnn does, and the gradients in float32 (``tinn.keys.PRECISIONS``;
    see ``docs/trainer.md``).
    """

    def __init__(self, n_input_dims: int, n_output_dims: int, encoding_config=None, network_config=None, *,
                 n_instances: int = 1, seed: int = 1337, precision: str = "float32"):
        precision = check_precision(precision)
        super().__init__(n_instances, seed)
        self.encoding = build_encoding(n_input_dims, load_config(encoding_config or {}),
                                        alignment=OUTPUT_ALIGNMENT, n_instances=n_instances, seed=seed)
        if not self.encoding.padded_output_width:
            raise ValueError(f"encoding '{self.encoding.name}' of the {n_input_dims} input dims has no outputs, so "
                             "the network would have no inputs (use it inside a Composite to drop some dims)")
        check_sizes(self.encoding)
        self.network = build_network(self.encoding.padded_output_width, n_output_dims,
                                      load_config(network_config or {}), n_instances=n_instances, seed=seed)
        self.n_input_dims, self.n_output_dims = self.encoding.n_input_dims, self.network.n_output_dims
        self.padded_output_width = self.network.padded_output_width
        self.n_params = self.network.n_params + self.encoding.n_params
        allocate(self, precision=precision)

    def hyperparams(self):
        """``{"otype": "NetworkWithInputEncoding", "encoding": {...}, "network": {...}}``: rebuilds the model."""
        return {"otype": "NetworkWithInputEncoding", "encoding": self.encoding.hyperparams(),
                "network": self.network.hyperparams()}

    def layer_sizes(self):
        """The network's matrices (the optimizers' "matrix parameters"); the encoding's are not matrices."""
        return self.network.layer_sizes()

    def bind(self, store, offset):
        """The network's parameters at ``offset``, the encoding's right after them."""
        super().bind(store, offset)
        self.network.bind(store, offset)
        self.encoding.bind(store, offset + self.network.n_params)

    def initial_params(self, rng):
        """The network's draws, then the encoding's, from one generator (tcnn's order)."""
        return np.concatenate([self.network.initial_params(rng), self.encoding.initial_params(rng)], axis=-1)

    def _sample_funcs(self, weights, grads):
        """Per sample: ``y = network(encoding(x))``; the vjp runs the network's and then the encoding's,
        both at ``weights`` (the training weights for ``backward_func``, the encoding included)."""
        encode, encoding_vjp = self.encoding._sample_funcs(weights, grads)
        network, network_vjp = self.network._sample_funcs(weights, grads)

        @ti.func
        def forward(x, k=0):
            return network(encode(x, k), k)

        @ti.func
        def vjp(x, dy, k=0):
            return encoding_vjp(x, network_vjp(encode(x, k), dy, k), k)
        return forward, vjp

    def _floats_per_sample(self, training):
        return self.encoding._floats_per_sample(training) + self.network._floats_per_sample(training)

    def _sorts_routed(self):
        return self.network._sorts_routed()

    def _dense_needs_sort(self):
        return self.network._dense_needs_sort()

    def _inference(self, x, batch):
        return self._inference_into(x, batch, None)

    def _inference_into(self, x, batch, out):
        """The encoding's kernel, then the network's (into ``out``, or ``None``: a new array); one launch for both
        where the network's kernel runs the encoding sample by sample itself (the fused MLP kernels with a grid or a
        per-dimension encoding, on device batches: ``Network._runs_encoding``)."""
        network = self.network
        if network._runs_encoding(self.encoding, batch):
            return network._inference_into(x, batch, out, encoding=self.encoding)
        encoded = self.encoding._inference(x, batch)
        return network._inference(encoded, batch) if out is None else network._inference_into(encoded, batch, out)

    def _forward(self, x, batch):
        encoded, enc_ctx = self.encoding._forward(x, batch)
        y, net_ctx = self.network._forward(encoded, batch)
        return y, Context(self, x, batch, enc_ctx=enc_ctx, net_ctx=net_ctx)

    def _backward(self, ctx, dL_dy, input_gradient, overwrite=False):
        needs_encoding = input_gradient or self.encoding.n_params > 0
        dL_dencoded = self.network._backward(ctx.net_ctx, dL_dy, needs_encoding, overwrite)
        if not needs_encoding:
            return None
        return self.encoding._backward(ctx.enc_ctx, dL_dencoded, input_gradient, overwrite)

    def _input_gradient(self, ctx, dL_dy):
        return self.encoding._input_gradient(ctx.enc_ctx, self.network._input_gradient(ctx.net_ctx, dL_dy))

    def _backward_backward_input(self, ctx, dL_ddLdx, dL_dy, overwrite):
        """With e = encoding(x): ``L2 = <v, J_e^T ebar> = <J_e v, ebar>``, ``ebar = J_net^T dL_dy``. So the network's
        first-order input gradient ``ebar`` comes first (no parameter gradients), the encoding's second order
        with ``(v, ebar)`` gives ``J_e v``, the network's second order with ``(J_e v, dL_dy)`` gives dL2/d(dL_dy)
        and dL2/de, and dL2/de goes back through the encoding's first-order backward (adding to its
        parameter gradients)."""
        net = self.network
        ebar, state = net._second_order_begin(ctx.net_ctx, dL_dy, input_gradient=True)
        e_dot, dx = self.encoding._backward_backward_input(ctx.enc_ctx, dL_ddLdx, ebar, overwrite)
        d_dy, d_e = net._second_order_end(ctx.net_ctx, state, e_dot, overwrite)
        if d_e is not None:
            through = self.encoding._backward(ctx.enc_ctx, d_e, True, overwrite=False)
            dx = through if dx is None else ctx.batch.ops.add(dx, through)
        return d_dy, dx
