"""The MLP's per-sample ``ti.func``s, for users' own kernels (``MLP.func``, ``MLP.backward_func``).

Every vector of a sample (layer inputs, pre-activations, gradients) lives in one local array, indexed
dynamically (the forward: two rows as wide as the widest layer; the backward: each layer's input and
pre-activations packed at their own widths), and is written element by element in loops at run
time: only the (few) layers are unrolled. No vector is passed, returned or copied whole: each element
of a local array or copy is a statement that Taichi's compiler analyses (its CFG pass grows faster
than linearly with them), which made a func-based kernel compile for seconds. Each layer's
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

    # backward_func's one local vector: each layer's input h_l (h_0 = x) at H[l], then each layer's
    # pre-activations z_l at Z[l], packed at their own widths (a uniform-width matrix held 2L + 2 rows of the
    # widest layer: the statements Taichi's passes analyse grow with a local array's size, faster than linearly)
    H, Z, size = [], [], 0
    for rows, cols, _, _ in layers:
        H.append(size)
        size += cols
    for rows, cols, _, _ in layers:
        Z.append(size)
        size += rows

    @ti.func
    def backward_func(x, dy, k=0):
        buf = ti.Vector.zero(ti.f32, size)
        for i in ti.static(range(n_in)):
            buf[i] = x[i]
        for li in ti.static(range(n_layers)):
            rows, cols, off = ti.static(layers[li][0], layers[li][1], layers[li][2])
            for r in range(rows):
                acc = 0.0
                for c in range(cols):
                    acc += weights[k, off + r * cols + c] * buf[H[li] + c]
                buf[Z[li] + r] = acc
                if ti.static(li + 1 < n_layers):
                    buf[H[li + 1] + r] = activations.value(layers[li][3], acc)
        # going down, z_l is overwritten in place by dL/dz_l = act_l'(z_l) dL/dh_(l+1)
        for r in ti.static(range(n_out)):
            buf[Z[n_layers - 1] + r] = dy[r] * activations.derivative(layers[-1][3], buf[Z[n_layers - 1] + r])
        dx = ti.Vector.zero(ti.f32, n_in)
        for step in ti.static(range(n_layers)):
            li = ti.static(n_layers - 1 - step)
            rows, cols, off = ti.static(layers[li][0], layers[li][1], layers[li][2])
            if ti.static(with_grads):
                for r in range(rows):
                    g = buf[Z[li] + r]
                    for c in range(cols):
                        ti.atomic_add(grads[k, off + r * cols + c], g * buf[H[li] + c])
            for c in range(cols):
                acc = 0.0
                for r in range(rows):
                    acc += weights[k, off + r * cols + c] * buf[Z[li] + r]
                if ti.static(li > 0):
                    buf[Z[li - 1] + c] = acc * activations.derivative(layers[li - 1][3], buf[Z[li - 1] + c])
                else:
                    dx[c] = acc
        return dx

    return func, backward_func
