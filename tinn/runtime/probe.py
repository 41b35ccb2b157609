"""Counting what a call costs the host: kernel launches, read-backs and numpy kernel arguments.

A device step's cost off the CPU is mostly its launches (each one Python work plus a driver call) and
its read-backs (each one a wait for the whole device). :func:`counting` records them for the calls made
inside its block, so tests can hold the counts of a step and benchmarks can report them::

    with counting() as seen:
        trainer.training_step(x, target)
    seen.launches, seen.read_backs, seen.numpy_arguments

Launches are every ``@ti.kernel`` call (tinn's and Taichi's own, such as the copy kernels behind
``to_numpy`` / ``from_numpy``); read-backs are ``ti.ndarray.to_numpy`` calls; numpy arguments are numpy
arrays handed to a kernel other than Taichi's copies (on CUDA each one is a device allocation, two
copies and two waits), a view of a field's own memory on the CPU (``_memory.HostView``) excepted. ``moved``
counts the elements that crossed between host and device: every numpy array handed to any kernel, Taichi's
copies included (a field's or a ``ti.ndarray``'s ``to_numpy`` / ``from_numpy`` is one such kernel), the
``HostView`` again excepted. The hooks are installed for the block only.
"""
import contextlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from taichi.lang._ndarray import Ndarray
from taichi.lang.kernel_impl import Kernel

from .memory import HostView

COPY_KERNELS = ("ndarray_to_ext_arr", "ext_arr_to_ndarray")
"""Taichi's own ``to_numpy`` / ``from_numpy`` kernels."""


@dataclass
class Seen:
    """What the calls of a :func:`counting` block did."""

    kernels: Counter = field(default_factory=Counter)
    read_backs: int = 0
    uploads: int = 0
    numpy_arguments: list = field(default_factory=list)
    moved: int = 0

    @property
    def launches(self) -> int:
        """Every kernel launch, Taichi's copies included."""
        return sum(self.kernels.values())


@contextlib.contextmanager
def counting():
    """Count launches, read-backs and numpy kernel arguments within the block (:class:`Seen`)."""
    seen = Seen()
    launch, reads = Kernel.__call__, {n: getattr(Ndarray, n) for n in ("_ndarray_to_numpy", "_ndarray_matrix_to_numpy")}

    def call(kernel, *args, **kwargs):
        name = kernel.func.__name__
        seen.kernels[name] += 1
        seen.moved += sum(a.size for a in (*args, *kwargs.values())
                          if isinstance(a, np.ndarray) and not isinstance(a, HostView))
        if name == COPY_KERNELS[1]:
            seen.uploads += 1
        elif name != COPY_KERNELS[0]:
            seen.numpy_arguments += [(name, a.shape) for a in (*args, *kwargs.values())
                                     if isinstance(a, np.ndarray) and not isinstance(a, HostView)]
        return launch(kernel, *args, **kwargs)

    def reader(real):
        def read(nd, *args, **kwargs):
            seen.read_backs += 1
            return real(nd, *args, **kwargs)
        return read

    Kernel.__call__ = call
    for name, real in reads.items():
        setattr(Ndarray, name, reader(real))
    try:
        yield seen
    finally:
        Kernel.__call__ = launch
        for name, real in reads.items():
            setattr(Ndarray, name, real)
