"""What one call costs the host, for the benchmarks' reports: kernel launches and read-backs.

:func:`per_call` runs a callable once (after the benchmark's own warm-up) inside
``tinn.runtime.probe.counting()`` and returns ``{"launches": n, "read_backs": m}``: every ``@ti.kernel``
launch (Taichi's own copy kernels included) and every ``ti.ndarray`` read-back to the host.
"""
import taichi as ti

from tinn.runtime import probe as _probe


def per_call(fn) -> dict:
    """Launches and read-backs of one ``fn()`` (the device is idle before and after it)."""
    ti.sync()
    with _probe.counting() as seen:
        fn()
        ti.sync()
    return {"launches": seen.launches, "read_backs": seen.read_backs}
