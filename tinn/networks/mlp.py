"""The multilayer perceptron behind tcnn's ``FullyFusedMLP`` and ``CutlassMLP``.

Keys: ``MLP.KEYS`` (``n_neurons`` H, ``n_hidden_layers`` NL, ``activation``, ``output_activation``).
No biases::

    h_0 = x,   h_k = act(W_{k-1} h_{k-1}) for k = 1..NL,   y = out_act(W_NL h_NL)

``W_0`` is H x n_in, the hidden matrices H x H, ``W_NL`` P x H with P = the output
width padded to 16 (NL = 0: one P x n_in matrix). Parameters are the matrices in that
order, each row-major. Initialisation is Xavier uniform per matrix,
``U(-s, s)``, ``s = sqrt(6 / (fan_in + fan_out))``; with ``activation = "Sine"``,
``s = 30 / fan_in`` for W_0 and ``sqrt(6 / fan_in)`` after (SIREN).

Backward: ``delta_NL+1 = out_act'(z) * dL/dy``, ``dL/dW_k = delta_{k+1}^T h_k`` summed
over the batch, ``delta_k = act'(z_k) * (delta_{k+1} W_k)``, ``dL/dx = delta_1 W_0``.

One implementation serves both otypes and any width or depth (tinn has no tensor-core width
rule). The class holds the config, the layout (``MLP.plan``, a ``_mlp_plan.MLPPlan`` built once) and the
initialisation; the work is done by a backend, each reading the plan:
batches by ``_mlp_host.HostMLP`` on the CPU (numpy's BLAS on tinn's worker threads) or
``_kernel_mlp.KernelMLP`` on other archs (Taichi kernels on device buffers), chosen per call by the
batch's kind (``batch.on_device``) in ``MLP._batch_path``, and samples inside users' kernels by the
``ti.func``s of ``_mlp_funcs``.
"""
import warnings

import numpy as np

from ..keys import POSITIVE_INT, Key, Options, between, reported
from ..registry import networks
from . import activations
from ._kernel_mlp import KernelMLP, takes_fused
from ._mlp_funcs import sample_funcs
from ._mlp_host import HostMLP
from ._mlp_plan import MLPPlan
from .network import Network

MAX_HIDDEN_LAYERS = 1024
"""Deeper stacks are refused as a config error (each layer is a separate product on the host)."""


@networks.register("CutlassMLP", "MLP", "FullyFusedMLP", "MegakernelMLP")
class MLP(Network):
    """tcnn's ``CutlassMLP`` / ``FullyFusedMLP``: ``n_input_dims -> n_output_dims`` (module docstring)."""

    KEYS = {"n_neurons": Key(128, POSITIVE_INT, "width of the hidden layers"),
            "n_hidden_layers": Key(5, between(0, MAX_HIDDEN_LAYERS), "number of hidden layers"),
            "activation": Key("ReLU", choices=activations.NAMES, doc="of the hidden layers"),
            "output_activation": Key("None", choices=activations.NAMES, doc="of the output layer")}

    def __init__(self, n_input_dims: int, n_output_dims: int, *, n_neurons: int = 128, n_hidden_layers: int = 5,
                 activation: str = "ReLU", output_activation: str = "None", otype: str = "CutlassMLP",
                 n_instances: int = 1, seed: int = 1337):
        super().__init__(n_input_dims, n_output_dims, n_instances=n_instances, seed=seed)
        self.otype, self.n_neurons, self.n_hidden_layers = otype, n_neurons, n_hidden_layers
        self.activation, self.output_activation = activation, output_activation
        self.plan = MLPPlan.build(n_input_dims, n_output_dims, self.padded_output_width, n_neurons, n_hidden_layers,
                                  activation, output_activation)
        self.n_params = self.plan.n_params

    @classmethod
    def from_config(cls, n_input_dims, n_output_dims, config, *, otype="CutlassMLP", **kwargs):
        opt = Options("network", otype, config)
        canonical = "FullyFusedMLP" if otype.lower() in ("fullyfusedmlp", "megakernelmlp") else "CutlassMLP"
        values = opt.read(cls.KEYS)
        opt.accept("n_input_dims", "n_output_dims")               # tcnn configs may carry them
        opt.done()
        stacked = (values["n_hidden_layers"] if values["activation"] == "Exponential" else 0) + \
            (values["output_activation"] == "Exponential")
        if stacked >= 3:            # exp(exp(exp(z))) exceeds float32's 3.4e38 once z > 1.5
            warnings.warn(f"{opt.where}: {stacked} stacked 'Exponential' activations overflow float32 for "
                          "pre-activations above about 1.5, so expect inf/NaN outputs", stacklevel=3)
        return cls(n_input_dims, n_output_dims, otype=canonical, **values, **kwargs)

    def hyperparams(self):
        return {"otype": self.otype, **reported(self, self.KEYS)}

    def layer_sizes(self):
        """``(rows, cols)`` of each matrix as stored (the output matrix padded)."""
        return self.plan.stored_sizes()

    def _floats_per_sample(self, training: bool) -> int:
        """The host path's batch-sized arrays: the input (gathered per network), the output and, for
        training, every layer's output (and pre-activation where act' needs it); a pass's blocks are
        cache-sized."""
        if not training:
            return self.n_input_dims + self.n_output_dims
        return self.n_input_dims + sum(layer.rows * (1 if activations.ACTIVATIONS[layer.activation].from_output
                                                     else 2) for layer in self.plan.layers)

    def initial_params(self, rng):
        blocks = []
        for i, (rows, cols) in enumerate(self.layer_sizes()):
            if self.activation == "Sine":
                s = 30.0 / cols if i == 0 else np.sqrt(6.0 / cols)
            else:
                s = np.sqrt(6.0 / (rows + cols))
            s = np.float32(s)
            blocks.append(rng.draws(rows * cols) * (s * np.float32(2)) - s)
        return np.concatenate(blocks, axis=-1)

    # -- one sample inside a user's kernel -----------------------------------------
    def _sample_funcs(self, weights, grads):
        return sample_funcs(self.plan, self._offset, weights, grads)

    # -- batch API ---------------------------------------------------------------
    def _batch_path(self, batch):
        """The backend that runs a batch of ``batch``'s kind (``batch.on_device``, told once per call by
        ``tinn.batch.batch.as_batch``): numpy's BLAS for host batches, Taichi kernels for device buffers. Each is
        made on first use and kept."""
        on_device = batch.on_device
        paths = self.__dict__.setdefault("_paths", {})
        if on_device not in paths:
            paths[on_device] = KernelMLP(self) if on_device else HostMLP(self)
        return paths[on_device]

    def _dense_needs_sort(self):
        return not takes_fused(self.plan)

    def _sorts_routed(self):
        """An array's device inference on the fused kernels reads the batch's tiles."""
        return self.n_instances > 1 and takes_fused(self.plan)

    def _runs_encoding(self, encoding, batch) -> bool:
        """On the fused kernels, an encoding with an in-kernel writer (``Encoding._features_into``) runs inside
        the MLP's forward: each tile's samples are encoded into shared memory, one launch for both."""
        return batch.on_device and self._batch_path(batch).takes_encoding(encoding, batch)

    def _inference(self, x, batch):
        return self._batch_path(batch).run(x, batch, keep=False)[0]

    def _inference_into(self, x, batch, out, encoding=None):
        """The last kernel writes straight into the device buffer ``out`` (``None``: a new one; ``(K, B_k, n)``: a
        dense batch's layout)."""
        return self._batch_path(batch).run(x, batch, keep=False, out=out, encoding=encoding)[0]

    def _forward(self, x, batch):
        return self._batch_path(batch).run(x, batch, keep=True)

    def _backward(self, ctx, dL_dy, input_gradient, overwrite=False):
        return self._batch_path(ctx.batch).backward(ctx, dL_dy, input_gradient, overwrite)

    def _input_gradient(self, ctx, dL_dy):
        return self._second_order_begin(ctx, dL_dy, input_gradient=True)[0]

    # -- second order: two halves, so that NetworkWithInputEncoding can run its encoding's between them --
    def _second_order_begin(self, ctx, dL_dy, input_gradient: bool):
        """``(dL/dx or None, state)``: the first-order input gradient (no parameter gradients) and what
        :meth:`_second_order_end` needs."""
        return self._batch_path(ctx.batch).output_adjoints(ctx, dL_dy, input_gradient)

    def _second_order_end(self, ctx, state, dL_ddLdx, overwrite: bool):
        return self._batch_path(ctx.batch).second_order(ctx, state, dL_ddLdx, overwrite)

    def _backward_backward_input(self, ctx, dL_ddLdx, dL_dy, overwrite):
        _, state = self._second_order_begin(ctx, dL_dy, input_gradient=False)
        return self._second_order_end(ctx, state, dL_ddLdx, overwrite)
