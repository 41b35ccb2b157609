"""The compiler and linker flags of a program that includes ``tinn_model.h``: the header's folder and the
Taichi C API's (``taichi/_lib/c_api/`` in the installed taichi wheel), ``-ltaichi_c_api`` and an rpath to it."""
import os


def _c_api() -> str:
    import taichi
    root = os.path.join(os.path.dirname(os.path.abspath(taichi.__file__)), "_lib", "c_api")
    if not os.path.isfile(os.path.join(root, "include", "taichi", "taichi_core.h")):
        raise RuntimeError(f"the installed taichi has no C API under {root} (taichi wheels ship it from 1.7)")
    return root


def include_dirs() -> list:
    """``[tinn_model.h's folder, the Taichi C API's include folder]``."""
    return [os.path.dirname(os.path.abspath(__file__)), os.path.join(_c_api(), "include")]


def cflags() -> str:
    """``-I`` flags for ``#include <tinn_model.h>`` (and the Taichi C API headers it includes)."""
    return " ".join(f"-I{_quote(d)}" for d in include_dirs())


def libs() -> str:
    """``-L... -ltaichi_c_api -Wl,-rpath,...``: link the Taichi C API and find it at run time."""
    lib = _quote(os.path.join(_c_api(), "lib"))
    return f"-L{lib} -ltaichi_c_api -Wl,-rpath,{lib}"


def _quote(path: str) -> str:
    """A path as one shell word (the flags are meant for ``$(...)`` in a build command)."""
    if any(c.isspace() for c in path):
        raise RuntimeError(f"the path {path!r} has white space: a $(python -m tinn.deploy ...) build command "
                           "would split it; install into a path without spaces")
    return path
