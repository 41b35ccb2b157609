"""The MLP's per-sample ``ti.func``s, for users' own kernels (``MLP.func``, ``MLP.backward_func``).

Every vector of a sample (layer inputs, pre-activations, gradients) is a row of one local matrix as
wide as the widest layer, indexed dynamically, and is written element by element in loops at run
time: only the (few) layers are unrolled. No vector is passed, returned or copied whole: each such
copy of a 64-wide vector becomes 64 statements that Taichi's compiler analyses (its CFG pass grows
faster than linearly with them), which made a func-based kernel compile for seconds. Each layer's
activation is named by the plan (``activations.value`` / ``derivative``).
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
    layers = [(layer.rows, layer.cols, offset + layer.start, layer.activation) for layer in plan.layers]
    n_in, n_out, width, n_layers = plan.n_inputs, plan.n_outputs, plan.width, len(layers)

    @ti.func
    def layer(buf: ti.template(), k, src: ti.template(), dst: ti.template(), li: ti.template()):
        """``buf[dst] = W_li buf[src]``: the pre-activations of layer li."""
        rows, cols, off = ti.static(layers[li][0], layers[li][1], layers[li][2])
        for r in range(rows):
            acc = 0.0
            for c in range(cols):
                acc += weights[k, off + r * cols + c] * buf[src, c]
            buf[dst, r] = acc

    @ti.func
    def activate(buf: ti.template(), src: ti.template(), dst: ti.template(), li: ti.template()):
        """``buf[dst] = act_li(buf[src])`` over layer li's outputs."""
        for r in range(layers[li][0]):
            buf[dst, r] = activations.value(layers[li][3], buf[src, r])

    @ti.func
    def func(x, k=0):
        buf = ti.Matrix.zero(ti.f32, 2, width)            # row 0: a layer's input, row 1: its output
        for i in ti.static(range(n_in)):
            buf[0, i] = x[i]
        for li in ti.static(range(n_layers)):
            layer(buf, k, 0, 1, li)
            activate(buf, 1, 0, li)
        y = ti.Vector.zero(ti.f32, n_out)
        for i in ti.static(range(n_out)):
            y[i] = buf[0, i]
        return y

    @ti.func
    def backward_func(x, dy, k=0):
        # rows 0..NL-1: the input of each layer; NL..2NL-1: its pre-activations; 2NL, 2NL+1: the gradient
        # (ping-pong between the two as it goes down the layers)
        buf = ti.Matrix.zero(ti.f32, 2 * n_layers + 2, width)
        for i in ti.static(range(n_in)):
            buf[0, i] = x[i]
        for li in ti.static(range(n_layers)):
            layer(buf, k, li, n_layers + li, li)
            if ti.static(li + 1 < n_layers):
                activate(buf, n_layers + li, li + 1, li)
        G = ti.static(2 * n_layers)
        for i in ti.static(range(n_out)):
            buf[G, i] = dy[i]
        for step in ti.static(range(n_layers)):
            li = ti.static(n_layers - 1 - step)
            g, below = ti.static(G + step % 2, G + (step + 1) % 2)
            rows, cols, off = ti.static(layers[li][0], layers[li][1], layers[li][2])
            for r in range(rows):
                buf[g, r] *= activations.derivative(layers[li][3], buf[n_layers + li, r])
            for c in range(cols):
                buf[below, c] = 0.0
            for r in range(rows):
                for c in range(cols):
                    if ti.static(with_grads):
                        ti.atomic_add(grads[k, off + r * cols + c], buf[g, r] * buf[li, c])
                    buf[below, c] += weights[k, off + r * cols + c] * buf[g, r]
        out = ti.static(G + n_layers % 2)
        dx = ti.Vector.zero(ti.f32, n_in)
        for i in ti.static(range(n_in)):
            dx[i] = buf[out, i]
        return dx

    return func, backward_func
