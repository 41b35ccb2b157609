"""Counting Taichi's compiles: which kernels a block of code compiles (a new instantiation counts)."""
import contextlib

from taichi.lang.kernel_impl import Kernel

from tinn.runtime.kernels import ARENA


class Compiled(list):
    """The names of the kernels compiled, in order; ``kernels``: the Taichi kernels themselves, in the same order."""

    def __init__(self):
        super().__init__()
        self.kernels = []


def takes_parameter_memory(kernel) -> bool:
    """Whether a Taichi kernel takes arena memory (an ``ARENA`` argument: ``tinn.runtime.kernels.arena_kernel``), so
    that off the CPU it is compiled once per arena chunk it is given."""
    return any(type(a.annotation) is type(ARENA) for a in kernel.arguments)


@contextlib.contextmanager
def compilations():
    """The names of the Taichi kernels compiled within the block (a new instantiation counts)."""
    names, materialize = Compiled(), Kernel.materialize

    def record(kernel, key=None, *args, **kwargs):
        if (key or (kernel.func, 0, kernel.autodiff_mode)) not in kernel.compiled_kernels:
            names.append(kernel.func.__name__)
            names.kernels.append(kernel)
        return materialize(kernel, key, *args, **kwargs)

    Kernel.materialize = record
    try:
        yield names
    finally:
        Kernel.materialize = materialize
