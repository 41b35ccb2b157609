"""Composite encoding and the NRC preset (tcnn ``encodings/composite.h``).

Keys: ``nested`` (required list of encoding configs), ``reduction`` ("Concatenation";
also "Sum", "Product"). In each nested config, ``n_dims_to_encode`` gives the input dims
it takes (at most one entry may leave it out and gets the remaining
``n_input_dims - sum(specified)``) and ``dims_to_encode_begin`` its first input dim
(default: where the previous entry ended; if any entry gives it, every entry must give
``n_dims_to_encode``). Entries that resolve to 0 dims are dropped.

* **Concatenation**: ``y = [E_0(x[s_0]) | pad_0 | E_1(x[s_1]) | pad_1 | ...]``. Each nested
  encoding but the last is padded so the next starts at a multiple of the next one's
  ``required_output_alignment``: ``width_i = next_multiple(start_i + raw_i, align_(i+1)) - start_i``;
  each gap holds the fill value of the encoding it belongs to. The composite's own
  padding (``set_alignment``) goes to the last nested encoding.
* **Sum** / **Product**: every nested encoding is padded to the composite's alignment
  (the lcm of the nested ones) and all must end with the same width W (= the output
  width); ``y = sum_k E_k`` or ``prod_k E_k`` element-wise in float32, padding included.
  Backward: Sum gives every ``E_k`` the gradient ``dL/dy``; Product gives ``E_k``
  ``dL/dy * prod_(j != k) E_j``.

``required_output_alignment`` is the lcm of the nested ones. Parameters are the nested
encodings' parameters concatenated in order, bound at offsets into the composite's
(or its owner's) parameter store, and initialised in order from one generator.

Backward: every nested encoding adds its ``dL/dx`` slice into ``dL/dx``. Where slices
overlap (explicit ``dims_to_encode_begin``) tinn *sums* them, which is the true gradient;
tcnn lets the later slice overwrite the earlier. Input dims no entry reads get 0.

Batches are numpy arrays or ``ti.ndarray``s (the device path): the slices, concatenations and
element-wise sums and products are the batch's operations (``batch.ops``: numpy's for numpy, small
kernels that keep a ``ti.ndarray`` on the device), picked once per call.

``hyperparams()`` lists every nested entry with its resolved ``n_dims_to_encode`` and
``dims_to_encode_begin`` (tcnn drops them), so a composite rebuilds from it exactly.

``NRC`` / ``OneBlobFrequency`` (keys ``n_frequencies`` 12, ``n_bins`` 4) is the preset
composite of neural radiance caching: ``TriangleWave`` on input dims 0-2, ``OneBlob`` on
dims 3-7, ``Identity`` on the rest (dropped when there are exactly 8 dims).
"""
from math import lcm

import numpy as np
import taichi as ti

from ..keys import NON_NEGATIVE, REQUIRED, Key, between, reported
from ..object import Context
from ..registry import build_encoding, encodings
from ..runtime.kernels import specialised, static_chunks
from .encoding import Encoding, next_multiple
from .oneblob import BINS

REDUCTIONS = ("Concatenation", "Sum", "Product")
NESTED_KEYS = {"n_dims_to_encode": Key(0, NON_NEGATIVE, "input dims this entry encodes"),
               "dims_to_encode_begin": Key(0, NON_NEGATIVE, "its first input dim")}
"""Keys of each entry of a Composite's ``nested`` list, read by the Composite."""


def _resolve(where: str, n_input_dims: int, nested) -> list:
    """``[(begin, n_dims, config without the composite's keys)]`` for the nested entries with dims, as tcnn."""
    if not isinstance(nested, (list, tuple)) or not all(isinstance(c, dict) for c in nested):
        raise ValueError(f"{where}: key 'nested' must be a list of encoding configs, got {nested!r}")

    def count(i, c, key):
        return NESTED_KEYS[key].convert(c[key], f"{where}: nested[{i}]", key)

    explicit = any("dims_to_encode_begin" in c for c in nested)
    unspecified = [i for i, c in enumerate(nested) if "n_dims_to_encode" not in c]
    if explicit and unspecified:
        raise ValueError(f"{where}: when a nested entry gives 'dims_to_encode_begin', every entry must give "
                         f"'n_dims_to_encode' (missing in nested{unspecified})")
    if len(unspecified) > 1:
        raise ValueError(f"{where}: only one nested entry may leave 'n_dims_to_encode' out (nested{unspecified} do)")
    specified = sum(count(i, c, "n_dims_to_encode") for i, c in enumerate(nested) if "n_dims_to_encode" in c)
    if not explicit and specified > n_input_dims:
        raise ValueError(f"{where}: the nested entries' 'n_dims_to_encode' add up to {specified}, more than the "
                         f"composite's {n_input_dims} input dims")
    entries, offset = [], 0
    for i, c in enumerate(nested):
        if "n_dims_to_encode" in c:
            if "dims_to_encode_begin" in c:
                offset = count(i, c, "dims_to_encode_begin")
            n = count(i, c, "n_dims_to_encode")
        else:
            n = n_input_dims - specified
        if offset + n > n_input_dims:
            raise ValueError(f"{where}: nested[{i}] encodes input dims {offset}..{offset + n - 1}, beyond the "
                             f"composite's {n_input_dims} input dims")
        if n > 0:
            entries.append((offset, n, {k: v for k, v in c.items() if k not in NESTED_KEYS}))
        offset += n
    if not entries:
        raise ValueError(f"{where}: no nested encoding has any input dims to encode")
    return entries


@encodings.register("Composite")
class CompositeEncoding(Encoding):
    KEYS = {"nested": Key(REQUIRED, kind=list, doc="a list of encoding configs"),
            "reduction": Key("Concatenation", choices=REDUCTIONS, doc="how the nested outputs combine")}

    def __init__(self, n_input_dims: int, nested: list, reduction: str = "Concatenation", *, n_instances: int = 1,
                 seed: int = 1337, where: str = "encoding 'Composite'"):
        super(Encoding, self).__init__(n_instances, seed)        # the widths are properties of the nested encodings
        match = [r for r in REDUCTIONS if isinstance(reduction, str) and r.lower() == reduction.lower()]
        if not match:
            raise ValueError(f"{where}: key 'reduction' must be one of {', '.join(REDUCTIONS)}; got {reduction!r}")
        self.reduction = match[0]
        self.n_input_dims = n_input_dims
        entries = _resolve(where, n_input_dims, nested)
        self.slices = [(begin, n) for begin, n, _ in entries]
        self.nested = [build_encoding(n, cfg, n_instances=n_instances, seed=seed) for _, n, cfg in entries]
        self.n_params = sum(e.n_params for e in self.nested)
        if self.reduction == "Concatenation":
            start = 0
            for e, following in zip(self.nested[:-1], self.nested[1:]):
                e.set_padded_output_width(next_multiple(start + e.padded_output_width,
                                                        following.required_output_alignment) - start)
                start += e.padded_output_width
        else:
            for e in self.nested:
                e.set_alignment(self.required_output_alignment)
            widths = [e.padded_output_width for e in self.nested]
            if len(set(widths)) != 1:
                raise ValueError(f"{where}: reduction '{self.reduction}' needs nested encodings of equal output "
                                 f"width, got widths {widths}")
        self.n_raw_output_dims = self.padded_output_width

    def hyperparams(self):
        nested = [{**e.hyperparams(), "n_dims_to_encode": n, "dims_to_encode_begin": begin}
                  for e, (begin, n) in zip(self.nested, self.slices)]
        return {"otype": "Composite", "nested": nested, "reduction": self.reduction}

    # -- widths: the nested encodings hold them ------------------------------------
    @property
    def padded_output_width(self) -> int:
        if self.reduction == "Concatenation":
            return sum(e.padded_output_width for e in self.nested)
        return self.nested[0].padded_output_width

    @property
    def required_output_alignment(self) -> int:
        return lcm(*(e.required_output_alignment for e in self.nested))

    def set_padded_output_width(self, width: int):
        if width < self.n_raw_output_dims:
            raise ValueError(f"padded width {width} is below the encoding's width {self.n_raw_output_dims}")
        if self.reduction == "Concatenation":
            last = self.nested[-1]
            last.set_padded_output_width(width - (self.padded_output_width - last.padded_output_width))
        else:
            for e in self.nested:
                e.set_padded_output_width(width)

    # -- parameters: one slice per nested encoding, in order -------------------------
    def bind(self, store, offset):
        super().bind(store, offset)
        for e in self.nested:
            e.bind(store, offset)
            offset += e.n_params

    def initial_params(self, rng):
        return np.concatenate([e.initial_params(rng) for e in self.nested] + [np.zeros(rng.shape + (0,), np.float32)],
                              axis=-1)

    # -- batch API -------------------------------------------------------------------
    def _run(self, x, batch, keep: bool):
        ops, outs, ctxs = batch.ops, [], []
        for e, (begin, n) in zip(self.nested, self.slices):
            xi = ops.columns(x, begin, n)
            if keep:
                y, c = e._forward(xi, batch)
                ctxs.append(c)
            else:
                y = e._inference(xi, batch)
            outs.append(y)
        if self.reduction == "Concatenation":
            y = ops.concatenate(outs)
        else:
            y = ops.fold(outs, "+" if self.reduction == "Sum" else "*")
        if not keep:
            return y, None
        return y, Context(self, x, batch, nested=ctxs, outs=outs if self.reduction == "Product" else None)

    def _floats_per_sample(self, training):
        return self.padded_output_width + sum(e._floats_per_sample(training) for e in self.nested)

    def _inference(self, x, batch):
        return self._run(x, batch, keep=False)[0]

    def _forward(self, x, batch):
        return self._run(x, batch, keep=True)

    @property
    def fill_value(self) -> float:
        """The composite's padded columns are its last nested encoding's (``set_padded_output_width``)."""
        return self.nested[-1].fill_value

    def _features_into(self, batch):
        """A concatenation inside an MLP kernel: each nested encoding's writer on its input slice, at its output
        column and parameters, and each gap after it filled with its own ``fill_value``. ``None`` for a Sum or
        Product, or when a nested encoding has no writer (then the composite runs its own kernels first)."""
        if self.reduction != "Concatenation":
            return None
        parts, column = [], 0
        for e, (begin, n) in zip(self.nested, self.slices):
            writer = e._features_into(batch)
            if writer is None:
                return None
            parts.append((writer, begin, n, column, e.n_raw_output_dims, e.padded_output_width, float(e.fill_value),
                          e._offset - self._offset))
            column += e.padded_output_width
        return _concatenation_writer(tuple(parts))

    # -- one sample inside a user's kernel ------------------------------------------------
    def _layout(self, weights, grads):
        """Static layout: per nested encoding (its forward and vjp funcs, input begin, dims, output column, width)."""
        out, column = [], 0
        for e, (begin, n) in zip(self.nested, self.slices):
            out.append(e._sample_funcs(weights, grads) + (begin, n, column, e.padded_output_width))
            if self.reduction == "Concatenation":
                column += e.padded_output_width
        return out

    def _sample_funcs(self, weights, grads):
        """Per sample: the nested encodings' funcs on their input slices, reduced; nested parameter
        gradients are added by their own vjps."""
        parts, width, reduction, n_in = self._layout(weights, grads), self.padded_output_width, self.reduction, \
            self.n_input_dims

        @ti.func
        def func(x, k=0):
            y = ti.Vector.zero(ti.f32, width)
            if ti.static(reduction == "Product"):
                y.fill(1.0)
            for i in ti.static(range(len(parts))):
                f, _, begin, n, column, w = ti.static(parts[i])
                yi = f(ti.Vector([x[begin + d] for d in ti.static(range(n))]), k)
                if ti.static(reduction == "Concatenation"):
                    for chunk in ti.static(static_chunks(range(w))):
                        for j in ti.static(chunk):
                            y[column + j] = yi[j]
                elif ti.static(reduction == "Sum"):
                    y += yi
                else:
                    y *= yi
            return y

        @ti.func
        def backward_func(x, dy, k=0):
            dx = ti.Vector.zero(ti.f32, n_in)
            for i in ti.static(range(len(parts))):
                _, b, begin, n, column, w = ti.static(parts[i])
                g = ti.Vector.zero(ti.f32, w)
                if ti.static(reduction == "Concatenation"):
                    for chunk in ti.static(static_chunks(range(w))):
                        for j in ti.static(chunk):
                            g[j] = dy[column + j]
                elif ti.static(reduction == "Sum"):
                    g = dy
                else:                                        # dL/dy * prod of the other factors
                    g = dy
                    for j in ti.static(range(len(parts))):
                        if ti.static(j != i):
                            g *= parts[j][0](ti.Vector([x[parts[j][2] + d] for d in ti.static(range(parts[j][3]))]), k)
                dxi = b(ti.Vector([x[begin + d] for d in ti.static(range(n))]), g, k)
                for d in ti.static(range(n)):
                    dx[begin + d] += dxi[d]
            return dx
        return func, backward_func

    def _nested_gradients(self, ops, ctx, dL_dy):
        """Per nested encoding ``(k, encoding, input begin, dims, its output gradient)``: a slice of ``dL_dy``
        (Concatenation), ``dL_dy`` itself (Sum) or ``dL_dy`` times the other factors (Product)."""
        column = 0
        for k, (e, (begin, n)) in enumerate(zip(self.nested, self.slices)):
            width = e.padded_output_width
            if self.reduction == "Concatenation":
                g = ops.columns(dL_dy, column, width)
                column += width
            elif self.reduction == "Sum":
                g = ops.contiguous(dL_dy)
            else:
                g = _times_others(ops, dL_dy, ctx.outs, k)
            yield k, e, begin, n, g

    def _backward(self, ctx, dL_dy, input_gradient, overwrite=False):
        ops = ctx.batch.ops
        dx = ops.full_like(ctx.x, 0.0) if input_gradient else None
        for k, e, begin, n, g in self._nested_gradients(ops, ctx, dL_dy):
            if not (input_gradient or e.n_params):
                continue
            dxi = e._backward(ctx.nested[k], g, input_gradient, overwrite)
            if input_gradient:
                ops.add_to_columns(dx, begin, dxi)
        return dx

    def _input_gradient(self, ctx, dL_dy):
        ops = ctx.batch.ops
        dx = ops.full_like(ctx.x, 0.0)
        for k, e, begin, n, g in self._nested_gradients(ops, ctx, dL_dy):
            ops.add_to_columns(dx, begin, e._input_gradient(ctx.nested[k], g))
        return dx

    def _backward_backward_input(self, ctx, dL_ddLdx, dL_dy, overwrite):
        """``dL/dx`` sums the nested encodings' input gradients, so each one's second order takes its input slice
        of ``dL_ddLdx`` and its output gradient ``g_k``, and gives ``t_k = dL2/dg_k``. Concatenation and Sum:
        dL2/d(dL_dy) concatenates or sums the ``t_k``. Product: ``g_k = dL_dy prod_(j != k) y_j``, so
        dL2/d(dL_dy) = ``sum_k t_k prod_(j != k) y_j``, and factor j also gets the first-order backward of
        ``dL_dy sum_(k != j) t_k prod_(i != j, k) y_i`` (its parameters' and inputs' share through the others)."""
        ops = ctx.batch.ops
        dx, ts = ops.full_like(ctx.x, 0.0), []
        for k, e, begin, n, g in self._nested_gradients(ops, ctx, dL_dy):
            t, dxi = e._backward_backward_input(ctx.nested[k], ops.columns(dL_ddLdx, begin, n), g, overwrite)
            ts.append(t)
            if dxi is not None:
                ops.add_to_columns(dx, begin, dxi)
        if self.reduction == "Concatenation":
            return ops.concatenate(ts), dx
        if self.reduction == "Sum":
            return ops.fold(ts, "+"), dx
        outs = ctx.outs
        d_dy = ops.fold([_times_others(ops, t, outs, k) for k, t in enumerate(ts)], "+")
        for j, (e, (begin, n)) in enumerate(zip(self.nested, self.slices)):
            others = [_times_others(ops, t, outs, j, k) for k, t in enumerate(ts) if k != j]
            if others:                               # a single factor has no share through the others
                g = ops.multiply(dL_dy, ops.fold(others, "+"))
                ops.add_to_columns(dx, begin, e._backward(ctx.nested[j], g, True, False))
        return d_dy, dx


@specialised
def _concatenation_writer(parts: tuple):
    """The in-kernel writer (``Encoding._features_into``) of a concatenation of ``parts``: per nested encoding
    ``(writer, input begin, input dims, output column, raw width, padded width, fill, parameter offset)``."""

    @ti.func
    def features_into(weights: ti.template(), base, k, xs, put: ti.template(), sh: ti.template(), tile, q, col0):
        for i in ti.static(range(len(parts))):
            writer, begin, n, column, raw, width, fill, offset = ti.static(parts[i])
            writer(weights, base + offset, k, ti.Vector([xs[begin + d] for d in ti.static(range(n))]), put, sh, tile,
                   q, col0 + column)
            for c in ti.static(range(raw, width)):
                put(sh, tile, q, col0 + column + c, fill)

    return features_into


def _times_others(ops, a, factors: list, *skip: int):
    """``a`` times the element-wise product of ``factors`` but those at the indices ``skip`` (``a`` itself,
    contiguous, if none is left), with the batch operations ``ops``."""
    rest = [f for i, f in enumerate(factors) if i not in skip]
    return ops.multiply(a, ops.fold(rest, "*")) if rest else ops.contiguous(a)


@encodings.register("NRC", "OneBlobFrequency")
class NRCEncoding(CompositeEncoding):
    KEYS = {"n_frequencies": Key(12, between(1, 32), "TriangleWave octaves"),
            "n_bins": Key(4, BINS, "OneBlob bins")}

    def __init__(self, n_input_dims: int, n_frequencies: int = 12, n_bins: int = 4, **kwargs):
        if n_input_dims < 8:
            raise ValueError(f"encoding 'NRC' encodes 3 dims with TriangleWave and 5 with OneBlob: n_input_dims "
                             f"must be at least 8, got {n_input_dims}")
        self.n_frequencies, self.n_bins = n_frequencies, n_bins
        nested = [{"otype": "TriangleWave", "n_frequencies": n_frequencies, "n_dims_to_encode": 3},
                  {"otype": "OneBlob", "n_bins": n_bins, "n_dims_to_encode": 5},
                  {"otype": "Identity"}]
        super().__init__(n_input_dims, nested, "Concatenation", where="encoding 'NRC'", **kwargs)

    def hyperparams(self):
        return {"otype": "NRC", **reported(self, self.KEYS)}
