"""The MLP's per-sample ``ti.func``s, for users' own kernels (``MLP.func``, ``MLP.backward_func``).

Activations live in local buffers as wide as the widest layer, indexed dynamically, so only the
(few) layers are unrolled; each layer's activation is named by the plan (``activations.value`` / ``derivative``).
"""
import taichi as ti

from . import activations


def sample_funcs(plan, offset: int, weights, grads):
    """Per-sample forward and backward ``ti.func``s of the MLP of ``plan`` (``_mlp_plan.MLPPlan``) whose
    parameters start at column ``offset``, reading ``weights[instance, ...]``.

    The backward recomputes the forward pass and adds ``dL/dW`` to ``grads`` atomically (user
    kernels run samples in parallel), unless ``grads`` is None.
    """
    with_grads = grads is not None
    layers = [(layer.rows, layer.cols) for layer in plan.layers]
    offsets = [offset + layer.start for layer in plan.layers]
    acts = [layer.activation for layer in plan.layers]
    n_in, n_out, width, n_layers = plan.n_inputs, plan.n_outputs, plan.width, len(layers)

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
                    if ti.static(with_grads):
                        ti.atomic_add(grads[k, off + r * cols + c], ti.cast(g[r] * hs[li, c], grads.dtype))
                    below[c] += weights[k, off + r * cols + c] * g[r]
            g = below
        return head(g, n_in)

    return func, backward_func

