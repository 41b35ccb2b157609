"""Dense products on the host BLAS, split across CPU threads by tinn itself.

OpenBLAS's own worker threads busy-wait between calls; interleaved with Taichi's
thread pool (or any other busy process) that costs several times the work itself on a
2-core machine. So each product runs as single-threaded BLAS calls on row blocks, one
block per Python worker thread (numpy releases the GIL inside BLAS), and the BLAS
thread count is restored afterwards so the user's own numpy is left as it was.
"""
import ctypes
import glob
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np


def _openblas():
    """numpy's bundled OpenBLAS ``(get, set)`` thread-count functions, or ``None``."""
    libs = os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "*openblas*")
    for path in glob.glob(libs):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", ""):
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    return get, put
    return None


_CONTROL = _openblas()
_POOL: ThreadPoolExecutor | None = None


def n_workers() -> int:
    return os.cpu_count() or 1


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(n_workers(), thread_name_prefix="tinn-blas")
    return _POOL


@contextmanager
def single_threaded():
    """BLAS calls inside run on one thread each; the previous setting is restored after."""
    if _CONTROL is None:
        yield
        return
    get, put = _CONTROL
    before = get()
    put(1)
    try:
        yield
    finally:
        put(before)


def _blocks(n: int, parts: int):
    step = -(-n // parts)
    return [(s, min(s + step, n)) for s in range(0, n, step)]


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for stacks ``a (G, S, n)`` and ``b (G, n, m)``, split over row blocks."""
    out = np.empty(a.shape[:-1] + b.shape[-1:], np.float32)
    workers = n_workers()
    if workers == 1 or a.shape[0] * a.shape[1] < 4096:
        np.matmul(a, b, out=out)
        return out
    axis = 0 if a.shape[0] >= workers else 1
    jobs = []
    with single_threaded():
        for lo, hi in _blocks(a.shape[axis], workers):
            sl = (slice(lo, hi),) if axis == 0 else (slice(None), slice(lo, hi))
            jobs.append(_pool().submit(np.matmul, a[sl], b if axis == 1 else b[lo:hi], out=out[sl]))
        for job in jobs:
            job.result()
    return out


def matmul_tn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a^T @ b`` per group for ``a (G, S, m)``, ``b (G, S, n)``: a reduction over the S samples."""
    workers = n_workers()
    at = a.transpose(0, 2, 1)
    if workers == 1 or a.shape[0] * a.shape[1] < 4096:
        return np.matmul(at, b)
    if a.shape[0] >= workers:
        out = np.empty((a.shape[0], a.shape[2], b.shape[2]), np.float32)
        with single_threaded():
            jobs = [_pool().submit(np.matmul, at[lo:hi], b[lo:hi], out=out[lo:hi])
                    for lo, hi in _blocks(a.shape[0], workers)]
            for job in jobs:
                job.result()
        return out
    with single_threaded():
        jobs = [_pool().submit(np.matmul, at[:, :, lo:hi], b[:, lo:hi]) for lo, hi in _blocks(a.shape[1], workers)]
        return sum(job.result() for job in jobs)
