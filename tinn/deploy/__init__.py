"""Deployment: a trained model's inference as a Taichi AOT module that a C or C++ program runs without Python.

    tinn.deploy.export(model, "folder")       # model.tcm, params.bin, model.json
    cc app.c $(python -m tinn.deploy --cflags --libs)     # app.c includes tinn_model.h

``import tinn`` does not import this package. See docs/deploy.md.
"""
from ._export import ARCHS, FORMAT_VERSION, export
from ._flags import cflags, include_dirs, libs

__all__ = ["ARCHS", "FORMAT_VERSION", "cflags", "export", "include_dirs", "libs"]
