"""Counting Taichi's compiles: which kernels a block of code compiles (a new instantiation counts)."""
import contextlib

from taichi.lang.kernel_impl import Kernel


@contextlib.contextmanager
def compilations():
    """The names of the Taichi kernels compiled within the block (a new instantiation counts)."""
    names, materialize = [], Kernel.materialize

    def record(kernel, key=None, *args, **kwargs):
        if (key or (kernel.func, 0, kernel.autodiff_mode)) not in kernel.compiled_kernels:
            names.append(kernel.func.__name__)
        return materialize(kernel, key, *args, **kwargs)

    Kernel.materialize = record
    try:
        yield names
    finally:
        Kernel.materialize = materialize
