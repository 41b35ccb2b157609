"""The live Taichi program: who calls ``ti.init``, which path its arch runs, and what a later ``ti.init`` leaves
behind.

The one switch, :func:`active`: on the CPU tinn computes MLP products with numpy's BLAS on host arrays
(``networks/_mlp_host.py``); on any other arch (CUDA, Vulkan, Metal, ...) that would move every activation across
the bus twice per step, so there batches live in ``ti.ndarray``s on the device and the MLP runs as Taichi kernels
(``networks/_kernel_mlp.py``). Tests set :data:`FORCE` to run the device path on the CPU, where it is checked
against the BLAS path. The operations on each kind of batch are ``tinn.batch.ops``
(``HOST``, ``DEVICE``); ``tinn.batch.batch.as_batch`` picks them for a batch.

tinn never calls ``ti.init`` itself (:func:`init` is a convenience with tuned settings). Every object
records the program it was built in (:class:`RuntimeBound`); using it after ``ti.init`` ran again (which
frees every field and ndarray) raises :class:`RuntimeResetError` instead of crashing the process, in
Python (``_check_runtime``) and while a user's kernel compiles (:func:`guarded`).

A process forked after Taichi was initialised (multiprocessing's ``fork`` start method, the Linux default,
and so torch DataLoader workers) inherits a Taichi program whose worker threads did not survive the fork:
any kernel there blocks forever. tinn notices the fork (``os.register_at_fork``) and its first call in the
child raises :class:`ForkedProcessError`, naming the ``spawn`` start method; the parent is not affected. A child
that starts a Taichi program of its own (``ti.reset()``, then ``ti.init``) can build and use new tinn objects there
(those from before the fork belong to the inherited program: :class:`RuntimeResetError`).

A ``ti.ndarray`` or a Taichi field made before the last ``ti.init`` is refused too (:func:`check_live`). Taichi
cannot tell: a freed ndarray's allocation id may name a live ndarray of the new program, and a field's shape or
dtype is read from its freed memory (the process crashes). So every ``ti.ndarray`` and every field records, when it
is made, a weak reference to Taichi's runtime object of the moment (``ti.init`` replaces that object, and the old
one goes); one whose runtime is not the current one belongs to a freed program (:func:`_stamp`). One made before
``import tinn`` carries no record and counts as made in the runtime current at the import. That record is the one
thing importing tinn sets up; it changes no Taichi behaviour.
"""
import ctypes
import ctypes.util
import functools
import os
import weakref

import taichi as ti
from taichi.lang import impl
from taichi.lang._ndarray import Ndarray
from taichi.lang.field import Field
from taichi.lang.exception import TaichiCompilationError
from taichi.lang.enums import AutodiffMode

from . import compiling


class RuntimeResetError(RuntimeError):
    """A tinn object was used after ``ti.init`` was called again."""


class ForkedProcessError(RuntimeError):
    """A tinn call in a process forked after Taichi was initialised (see the module docstring)."""


# -- the arch's path ----------------------------------------------------------------------------------------
FORCE = False
"""Use the device path on the CPU too (read at every call, by ``tinn.batch.batch.as_batch``: the kind of the call's
batches then picks every backend)."""


def is_cpu() -> bool:
    """Whether Taichi runs on the host's CPU (x64 or arm64)."""
    return impl.current_cfg().arch in (ti.x64, ti.arm64)


def active() -> bool:
    """Whether batches live in ``ti.ndarray``s and the MLP runs as kernels: every arch but the CPU."""
    return FORCE or not is_cpu()


HALF_ARCHS = ("x64", "arm64", "cuda", "vulkan")
"""The archs whose kernels read and write float16 fields (Taichi's f16): tested on x64, CUDA and Vulkan
(Mesa's llvmpipe; a Vulkan device needs ``shaderFloat16`` and 16-bit storage, which Taichi 1.7 cannot query).
Metal and OpenGL, untested, are refused. No kernel of tinn adds atomically into a float16 field."""


def require_half(what: str):
    """``ValueError`` naming ``what`` unless the current arch runs float16 fields (before any field or kernel)."""
    arch = impl.current_cfg().arch
    if arch.name not in HALF_ARCHS:
        raise ValueError(f"{what}: precision 'float16' needs float16 fields, which tinn runs on "
                         f"{', '.join(HALF_ARCHS)}; this Taichi program runs on {arch.name} (use precision 'float32')")


# -- forks and re-initialised programs ------------------------------------------------------------------
_FORK_ADVICE = (
    "this process was forked after Taichi was initialised (multiprocessing's 'fork' start method, the Linux "
    "default, or a torch DataLoader worker): Taichi's runtime does not survive a fork, and any kernel here would "
    "block forever. Start worker processes with the 'spawn' start method instead: "
    "multiprocessing.get_context('spawn') (or multiprocessing.set_start_method('spawn')), and for torch "
    "DataLoader(..., multiprocessing_context='spawn'); or keep tinn calls in the parent process")
_inherited = None              # the Taichi program this process inherited through a fork (unusable here)


def _after_fork_in_child():
    global _inherited
    _inherited = impl.get_runtime().prog or _inherited


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def check_not_forked():
    """:class:`ForkedProcessError` in a child forked after Taichi was initialised, while it runs the inherited
    program."""
    if _inherited is not None and impl.get_runtime().prog is _inherited:
        raise ForkedProcessError(_FORK_ADVICE)


class _TracedRuntimeResetError(RuntimeResetError, TaichiCompilationError):
    """Raised while a user's kernel is compiled: Taichi passes compilation errors on with their type."""


def init(arch=None, *, keep_large_buffers: bool = True, **kwargs):
    """Call ``ti.init`` with the settings tinn's CPU kernels are tuned for.

    A convenience only: any ``ti.init`` works. Keyword arguments are passed on
    (``offline_cache=True`` by default keeps compiled kernels across runs).
    ``keep_large_buffers`` asks glibc's malloc to recycle large blocks instead of
    returning them to the system after every step; a training step allocates its
    activations afresh, and zero-filling new pages otherwise costs about a third
    of a step on the CPU. It changes the allocator for the whole process.
    """
    check_not_forked()
    settings = dict(offline_cache=True)
    settings.update(kwargs)
    if keep_large_buffers:
        _keep_large_buffers()
    return ti.init(arch=ti.cpu if arch is None else arch, **settings)


def _keep_large_buffers():
    """glibc ``mallopt``: serve large blocks from the heap and keep freed memory for reuse."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):      # not glibc: nothing to tune
        return
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    mallopt(M_MMAP_THRESHOLD, 1 << 30)
    mallopt(M_TRIM_THRESHOLD, 1 << 31)
    mallopt(M_TOP_PAD, 1 << 28)


def current_program():
    """The live Taichi program; a clear error before ``ti.init`` (or in a child forked after it)."""
    check_not_forked()
    prog = impl.get_runtime().prog
    if prog is None:
        raise RuntimeError("Taichi is not initialised: call ti.init(...) (or tinn.init()) before creating tinn objects")
    return prog


class RuntimeBound:
    """Mixin: remembers the Taichi program an object's fields live in."""

    def _bind_runtime(self):
        self._program = current_program()

    def _check_runtime(self):
        check_not_forked()
        prog = impl.get_runtime().prog
        if prog is None:
            raise RuntimeResetError(
                f"this {type(self).__name__} was built before ti.reset() (or a ti.init since), which freed its "
                "Taichi fields: call ti.init(...) and build it anew")
        if prog is not self._program:
            raise RuntimeResetError(
                f"this {type(self).__name__} was built before ti.init was called again, which freed its "
                "Taichi fields; build it anew after ti.init")


class _TracedMisuseError(TaichiCompilationError):
    """A per-sample func used in a way that cannot work, found while the user's kernel is compiled."""


_AUTODIFF_ADVICE = (
    "{owner}'s per-sample funcs cannot be compiled into a Taichi autodiff kernel ({mode} mode, e.g. a kernel "
    "run inside ti.ad.Tape / ti.ad.FwAd): Taichi would differentiate the whole inlined model (a crash, or "
    "silently zero gradients). Enter the model into the Tape as a stage of Taichi Vector fields instead: "
    "tinn.ad.stage(network, x, y) for y = network(x), tinn.ad.gradient_stage(network, x, g) for "
    "g = d network(x)/dx (docs/differentiable_programming.md)")


def _check_not_autodiff(owner):
    """:class:`_TracedMisuseError` when the kernel being compiled is a reverse- or forward-mode autodiff kernel."""
    kernel = impl.get_runtime().current_kernel
    mode = getattr(kernel, "autodiff_mode", AutodiffMode.NONE)
    if mode not in (AutodiffMode.NONE, AutodiffMode.VALIDATION):
        raise _TracedMisuseError(_AUTODIFF_ADVICE.format(owner=type(owner).__name__, mode=mode.name.lower()))


def _static_length(v):
    """The number of components of a Taichi-scope vector (``None`` for a scalar)."""
    try:
        shape = v.get_shape() if hasattr(v, "get_shape") else getattr(v, "shape", None)
    except (RuntimeError, TaichiCompilationError):       # Taichi: "Getting shape of non-tensor type"
        shape = None
    if not shape:
        return None
    return shape[0] if len(shape) == 1 else tuple(shape)


def _check_length(owner, v, want: int, what: str):
    """:class:`_TracedMisuseError` unless ``v`` is a vector of ``want`` components."""
    got = _static_length(v)
    if got != want:
        raise _TracedMisuseError(
            f"{type(owner).__name__}'s per-sample func takes {what} as a ti.Vector of {want} components "
            f"({'n_input_dims' if what == 'x' else 'n_output_dims'} = {want}), not "
            f"{'a scalar' if got is None else f'{got} components'}")


def guarded(owner, func, n_args: int):
    """``func`` (a per-sample ``ti.func`` of ``owner`` taking ``n_args`` arguments plus the instance ``k``),
    checked while the user's kernel is compiled and bounded when it runs:

    * ``owner``'s fields belong to the live Taichi program: :class:`RuntimeResetError` instead of touching
      freed fields (which aborts the process);
    * the kernel is no autodiff kernel (``ti.ad.Tape``'s reverse pass, ``ti.ad.FwAd``): an error naming
      ``tinn.ad.stage`` / ``tinn.ad.gradient_stage``;
    * ``x`` has ``n_input_dims`` components (and ``dL_dy`` ``n_output_dims``): an error naming the key;
    * on the CPU the kernel compiles without Taichi's CFG optimisation, like tinn's own (``runtime/compiling.py``);
    * at run time a network id ``k`` outside ``[0, n_instances)`` (one unsigned comparison) gives a zero
      result and reads and writes nothing: the func never leaves ``owner``'s parameters.

    The func keeps ``owner``, and so its parameter memory, alive."""
    n_instances = owner.n_instances
    n_result = owner.n_output_dims if n_args == 1 else owner.n_input_dims

    def check(x, dy=None):
        try:
            owner._check_runtime()
        except RuntimeResetError as e:
            raise _TracedRuntimeResetError(str(e)) from None
        _check_not_autodiff(owner)
        compiling.mark(impl.get_runtime().current_kernel)
        _check_length(owner, x, owner.n_input_dims, "x")
        if dy is not None:
            _check_length(owner, dy, owner.n_output_dims, "dL_dy")

    if n_args == 1:
        @ti.func
        def guarded_func(x, k=0):
            ti.static(check(x))
            result = ti.Vector.zero(ti.f32, n_result)
            if ti.cast(k, ti.u32) < ti.u32(n_instances):
                result = func(x, k)
            return result
    else:
        @ti.func
        def guarded_func(x, dy, k=0):
            ti.static(check(x, dy))
            result = ti.Vector.zero(ti.f32, n_result)
            if ti.cast(k, ti.u32) < ti.u32(n_instances):
                result = func(x, dy, k)
            return result
    return guarded_func


def check_live(a, name: str):
    """:class:`RuntimeResetError` for a ``ti.ndarray`` or a Taichi field made before ``ti.init`` was called again."""
    made_in = getattr(a, "_tinn_runtime", _RUNTIME_AT_IMPORT)
    if made_in() is not impl.get_runtime():
        kind = "ti.ndarray" if isinstance(a, Ndarray) else "field"
        raise RuntimeResetError(f"the {kind} {name} was made before ti.init was called again, which freed it; "
                                "make it anew after ti.init")


def _stamp(cls):
    """Make every instance of ``cls`` (``Ndarray`` or ``Field``, whose ``__init__`` each kind runs first) keep a weak
    reference to the Taichi runtime it is made in, as ``_tinn_runtime``."""
    init = cls.__init__
    if getattr(init, "_tinn_stamps", False):           # tinn's modules loaded twice in one process
        return

    @functools.wraps(init)
    def stamped_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._tinn_runtime = weakref.ref(impl.get_runtime())

    stamped_init._tinn_stamps = True
    cls.__init__ = stamped_init


_RUNTIME_AT_IMPORT = weakref.ref(impl.get_runtime())
_stamp(Ndarray)
_stamp(Field)
