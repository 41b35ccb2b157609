"""Taichi plumbing below every component; imports nothing of tinn above it: who owns ``ti.init`` and which path its
arch runs (``program``), field memory (``memory``), kernel helpers (``kernels``), ndarray argument types (``types``),
host BLAS threads (``blas``), tcnn's pcg32 (``rng``), the launch probe (``probe``), the per-sample func plumbing
(``sample``) and a faster parse of tinn's kernels by Taichi (``parsing``)."""
