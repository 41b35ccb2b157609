"""Kernel argument types: the ``ti.ndarray`` annotations every kernel module spells the same way.

``F32_2D`` is a 2-D float32 ``ti.ndarray`` (or a numpy array, which Taichi copies in and out for the
call); ``F32_ANY`` takes any number of dimensions, ``ANY`` any dtype too; ``ANY_2D`` / ``ANY_3D`` any dtype
(a half-precision MLP's float16 activations, or float32: a kernel is compiled per dtype). The bottom floor: imports nothing of tinn.
"""
import taichi as ti

ANY = ti.types.ndarray()
ANY_2D = ti.types.ndarray(ndim=2)
ANY_3D = ti.types.ndarray(ndim=3)
F32_ANY = ti.types.ndarray(dtype=ti.f32)
F32_1D = ti.types.ndarray(dtype=ti.f32, ndim=1)
F32_2D = ti.types.ndarray(dtype=ti.f32, ndim=2)
F32_3D = ti.types.ndarray(dtype=ti.f32, ndim=3)
F32_4D = ti.types.ndarray(dtype=ti.f32, ndim=4)
I32_1D = ti.types.ndarray(dtype=ti.i32, ndim=1)
I32_2D = ti.types.ndarray(dtype=ti.i32, ndim=2)
I64_1D = ti.types.ndarray(dtype=ti.i64, ndim=1)
U64_1D = ti.types.ndarray(dtype=ti.u64, ndim=1)
U64_2D = ti.types.ndarray(dtype=ti.u64, ndim=2)
