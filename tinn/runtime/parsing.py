"""Faster parsing of tinn's kernels by Taichi: the same IR and the same messages, less repeated work.

Taichi turns a kernel's Python into its IR on every start of a process (its offline cache keys the compiled code
by that IR), and it inlines every ``ti.func`` at every call site, and every ``ti.static`` loop's body once per
iteration, by parsing and transforming the function's source again each time. Pure computations are repeated
on every such pass:

* the function's source lines (``inspect.getsourcelines``, which searches ``sys.modules`` for the function's
  module each time), each line passed through ``textwrap.fill``;
* each node's position text (``ASTTransformerContext.get_pos_info``: the file, the line, the code wrapped to 80
  columns with ``^`` under the node), which Taichi attaches to every IR statement it makes and prints in its
  error messages;
* and, for every ``ti.kernel`` / ``ti.func`` decorated, whether the decorating line is inside a class
  (``kernel_impl._inside_class``: the caller's source line, found the same way).

For functions defined in tinn's own files and Taichi's (``ti.math``, the matrix operations), these are computed
once and remembered: a function's source lines per code object, a node's position text per (code object, node
position and kind), and ``textwrap.fill`` per line; the class test of such a frame (or of importlib's, above a
module's top level) reads its line from ``linecache`` (where ``inspect`` reads it too) and applies Taichi's own
patterns. The results are the values Taichi computes itself, so the IR, Taichi's offline-cache keys and every
error message are unchanged (``tests/test_parsing.py`` compares them). A user's own code is parsed as Taichi
parses it (only its lines' ``fill`` is remembered: a pure function of the line).

Applied on ``import tinn`` for the Taichi version it is written against (:data:`TAICHI_VERSION`) when the
functions it wraps are there; otherwise, or with the environment variable ``TINN_PLAIN_PARSE=1``, Taichi is left
as it is.
"""
import linecache
import os
import sys
import textwrap
import types

import taichi as ti

TAICHI_VERSION = (1, 7, 4)
"""The Taichi release whose parser this module wraps (its functions' names and arguments)."""

_PACKAGES = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
             os.path.dirname(os.path.abspath(ti.__file__)) + os.sep)
"""tinn's and Taichi's own source folders: the functions whose parse is remembered (installed code, fixed while a
process runs; a user's code is parsed as Taichi parses it)."""
_SOURCES: dict = {}
"""code object -> (source file, (source lines, first line number)) of a tinn or Taichi function."""
_POSITIONS: dict = {}
"""(code object, function name, node kind, lineno, col_offset, end_lineno, end_col_offset, first body line)
-> a node's position text."""
TAICHI: dict = {}
"""Taichi's own functions that :func:`apply` wrapped, by name."""
_FILLED: dict = {}
"""(line, tabsize, width) -> ``textwrap.fill`` of it."""
APPLIED = {"patched": False}


def _ours(func) -> bool:
    code = getattr(func, "__code__", None)
    return code is not None and code.co_filename.startswith(_PACKAGES)


def _remembered(getsourcefile, getsourcelines):
    """``(getsourcefile, getsourcelines)`` that remember a tinn or Taichi function's answers (the lines as a new list each time)."""

    def source(func):
        entry = _SOURCES.get(func.__code__)
        if entry is None:
            entry = _SOURCES[func.__code__] = (getsourcefile(func), getsourcelines(func))
        return entry

    def file_of(func):
        return source(func)[0] if _ours(func) else getsourcefile(func)

    def lines_of(func):
        if not _ours(func):
            return getsourcelines(func)
        lines, first = source(func)[1]
        return list(lines), first

    return file_of, lines_of


def _remembered_positions(get_pos_info):
    """``get_pos_info`` remembering a tinn or Taichi function's node positions (what the text depends on: the function's
    source, fixed per code object, and the node's position and kind)."""

    def pos_info(ctx, node):
        func = getattr(ctx.func, "func", None)
        if func is None or not _ours(func):
            return get_pos_info(ctx, node)
        body = getattr(node, "body", None)
        key = (func.__code__, func.__name__, type(node).__name__, node.lineno, node.col_offset,
               getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None),
               body[0].lineno if isinstance(body, list) and body else None)
        text = _POSITIONS.get(key)
        if text is None:
            text = _POSITIONS[key] = get_pos_info(ctx, node)
        return text

    return pos_info


def _class_test(inside_class, patterns):
    """``kernel_impl._inside_class(level)`` for a tinn or Taichi frame: Taichi's test of the frame ``level`` above the caller
    (whether its current line, stripped, starts a class or ``@ti.data_oriented``, by Taichi's own ``patterns``),
    with the line read from ``linecache`` as ``inspect.getframeinfo`` reads it, without searching ``sys.modules``
    for the frame's module. A func decorated at a module's top level has its test look one frame further, into
    importlib's frozen code, which has no source: ``False``, as Taichi's test finds. Taichi's own test for other
    frames."""

    def test(level_of_class_stackframe):
        level = level_of_class_stackframe
        try:
            frame = sys._getframe(level)                 # (counted from here, as the original counts from itself)
        except ValueError:
            return inside_class(level + 1)
        file = frame.f_code.co_filename
        if not file.startswith(_PACKAGES + ("<frozen ",)):
            return inside_class(level + 1)
        line = linecache.getline(file, frame.f_lineno).strip()       # ("" for importlib's frozen code)
        return any(p.match(line) for p in patterns)

    return test


def _filled(line, tabsize=8, width=70):
    """``textwrap.fill(line, tabsize=..., width=...)``, remembered (the only way Taichi's parser calls it)."""
    key = (line, tabsize, width)
    text = _FILLED.get(key)
    if text is None:
        text = _FILLED[key] = textwrap.fill(line, tabsize=tabsize, width=width)
    return text


def apply() -> bool:
    """Wrap Taichi's parser as the module docstring says (once); whether it is wrapped."""
    if APPLIED["patched"]:
        return True
    if tuple(ti.__version__) != TAICHI_VERSION or os.environ.get("TINN_PLAIN_PARSE") == "1":
        return False
    from taichi.lang import kernel_impl
    from taichi.lang.ast import ast_transformer_utils, checkers
    context = ast_transformer_utils.ASTTransformerContext
    modules = (kernel_impl, checkers)
    if not all(hasattr(m, "getsourcefile") and hasattr(m, "getsourcelines") for m in modules) \
            or not hasattr(context, "get_pos_info") or not hasattr(kernel_impl, "_inside_class") \
            or not hasattr(kernel_impl, "_KERNEL_CLASS_STACKFRAME_STMT_RES") \
            or getattr(kernel_impl, "textwrap", None) is not textwrap:
        return False
    TAICHI.update(getsourcefile=kernel_impl.getsourcefile, getsourcelines=kernel_impl.getsourcelines,
                  get_pos_info=context.get_pos_info, inside_class=kernel_impl._inside_class)
    file_of, lines_of = _remembered(kernel_impl.getsourcefile, kernel_impl.getsourcelines)
    for m in modules:
        m.getsourcefile, m.getsourcelines = file_of, lines_of
    context.get_pos_info = _remembered_positions(context.get_pos_info)
    kernel_impl._inside_class = _class_test(kernel_impl._inside_class, kernel_impl._KERNEL_CLASS_STACKFRAME_STMT_RES)
    kernel_impl.textwrap = types.SimpleNamespace(fill=_filled, dedent=textwrap.dedent)
    APPLIED["patched"] = True
    return True
