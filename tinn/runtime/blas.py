"""Host work (dense products on the BLAS, numpy ufuncs) split across CPU threads by tinn itself.

OpenBLAS's own worker threads busy-wait between calls; interleaved with Taichi's
thread pool (or any other busy process) that costs several times the work itself on a
2-core machine. So the work is cut into blocks, tinn's worker threads take the blocks one by
one with single-threaded BLAS calls (numpy releases the GIL inside BLAS and its ufuncs),
and the BLAS thread count is restored afterwards so the user's own numpy is left as it was.
"""
import ctypes
import glob
import os
import threading
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
        _POOL = ThreadPoolExecutor(max(1, n_workers() - 1), thread_name_prefix="tinn-blas")  # + the caller
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


def for_blocks(n: int, block: int, fn):
    """Call ``fn(worker, lo, hi)`` over ``[0, n)`` cut into blocks of ``block`` (small enough that a block's
    intermediates stay in cache). The calling thread and the pool's threads take the next block whenever
    they are free, so a thread that is preempted or slower does not hold the others up. BLAS is
    single-threaded inside; ``fn`` may hold worker-private accumulators indexed by ``worker``."""
    starts = iter(range(0, n, block))
    workers = min(n_workers(), -(-n // block))
    lock = threading.Lock()

    def walk(worker):
        while True:
            with lock:
                lo = next(starts, None)
            if lo is None:
                return
            fn(worker, lo, min(lo + block, n))

    with single_threaded():
        jobs = [_pool().submit(walk, w) for w in range(1, workers)]
        walk(0)
        for job in jobs:
            job.result()
