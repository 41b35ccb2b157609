"""On the CPU tinn's kernels compile without Taichi's CFG optimisation (*lean*), the program's settings untouched.

Taichi's ``cfg_optimization`` (store-to-load forwarding and dead-store elimination over a kernel's control-flow
graph) costs about the product of a kernel's local stores and its blocks, so it grows faster than the kernel: a
user's kernel calling ``config_hash``'s ``backward_func`` spent more than half of its compile there. On the CPU,
LLVM's own passes forward the same loads afterwards: tinn's kernels compiled without it compute the same and run
as fast (``docs/performance.md``, "tinn's kernels without Taichi's CFG pass"). So on x64 and arm64 these kernels
compile lean:

* every kernel defined in tinn's own files;
* a user's kernel that calls a per-sample func (``program.guarded`` marks it while Taichi parses it, each
  instantiation on its own).

Only kernels without autodiff (``AutodiffMode.NONE``): Taichi's reverse-mode autodiff of a kernel compiled without
the pass gives wrong gradients. Other archs (CUDA, Vulkan, ...) compile as Taichi does: their run times are not
measured without the pass.

How: when Taichi has just made a new instantiation of such a kernel (``Kernel.materialize``), it is compiled with a
copy of the program's ``CompileConfig`` whose ``cfg_optimization`` is off (``Program.compile_kernel``). Taichi keys
its compiled kernels (in memory and in its offline cache) by a key it computes once per instantiation, from the
config of that instantiation's first compile; the compile at its launch, with the program's own config, finds the
kernel under that key. The program's config is never changed, so an interrupt at any line leaves every other
kernel compiling as before, and a lean compile that fails leaves the kernel to Taichi's own compile at its launch
(which reports the error as Taichi does).

Applied on ``import tinn`` for the Taichi version it is written against (``parsing.TAICHI_VERSION``); with the
environment variable ``TINN_CFG_OPTIMIZATION=1`` every kernel compiles as Taichi compiles it.
"""
import os

import taichi as ti
from taichi._lib import core as _ti_core
from taichi.lang import impl
from taichi.lang.enums import AutodiffMode

from .parsing import TAICHI_VERSION

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
"""tinn's source folder: kernels defined there compile lean."""

MARK = "_tinn_lean"
"""The attribute ``program.guarded`` sets on a user's kernel being parsed: that instantiation compiles lean."""

APPLIED = {"patched": False}


def mark(kernel):
    """Have the instantiation of the Taichi kernel ``kernel`` being parsed (a user's kernel calling a per-sample
    func) compile lean, if it has no autodiff."""
    if kernel is not None and getattr(kernel, "autodiff_mode", None) == AutodiffMode.NONE:
        setattr(kernel, MARK, True)


def _lean_config(config):
    """A copy of the program's ``CompileConfig`` (every setting Python can read and write) without the CFG pass."""
    lean = _ti_core.CompileConfig()
    for name in dir(_ti_core.CompileConfig):
        if not name.startswith("_") and not callable(getattr(config, name)):
            try:
                setattr(lean, name, getattr(config, name))
            except (AttributeError, TypeError):         # a read-only setting
                pass
    lean.cfg_optimization = False
    return lean


def _is_lean(kernel, marked: bool) -> bool:
    """Whether the instantiation Taichi just made of ``kernel`` compiles lean (``marked``: by ``program.guarded``)."""
    return kernel.autodiff_mode == AutodiffMode.NONE and impl.current_cfg().arch in (ti.x64, ti.arm64) and (
        marked or getattr(getattr(kernel.func, "__code__", None), "co_filename", "").startswith(_PACKAGE))


def _compile_lean(kernel, key):
    """Compile the instantiation ``key`` of ``kernel`` lean (before its launch's own compile, which then finds it)."""
    prog = impl.get_runtime().prog
    try:
        prog.compile_kernel(_lean_config(prog.config()), prog.get_device_caps(), kernel.compiled_kernels[key])
    except Exception:                                   # Taichi's own compile, at the launch, reports it
        pass


def _materializing(materialize):
    """``Kernel.materialize`` compiling a new lean instantiation as the module docstring says."""

    def wrapped(kernel, key=None, args=None, arg_features=None):
        if key is None:
            key = (kernel.func, 0, kernel.autodiff_mode)
        if key in kernel.compiled_kernels:
            return materialize(kernel, key, args, arg_features)
        kernel.__dict__.pop(MARK, None)
        result = materialize(kernel, key, args, arg_features)
        if _is_lean(kernel, kernel.__dict__.pop(MARK, False)):      # (materialize has added the key, or raised)
            _compile_lean(kernel, key)
        return result

    return wrapped


def apply() -> bool:
    """Wrap Taichi's ``Kernel.materialize`` as the module docstring says (once); whether it is wrapped."""
    if APPLIED["patched"]:
        return True
    from taichi.lang.kernel_impl import Kernel
    if tuple(ti.__version__) != TAICHI_VERSION or os.environ.get("TINN_CFG_OPTIMIZATION") == "1" \
            or not hasattr(_ti_core, "CompileConfig") or not hasattr(Kernel, "materialize"):
        return False
    Kernel.materialize = _materializing(Kernel.materialize)
    APPLIED["patched"] = True
    return True
