"""A folder that ``python -m tinn.torch`` puts on ``sys.path``: its ``tinycudann`` package is :mod:`tinn.torch`.

A worker process started with ``spawn`` (multiprocessing's ``spawn`` context, a torch ``DataLoader`` with
``multiprocessing_context="spawn"``) is a fresh interpreter that re-imports the script with the parent's
``sys.path``; there the script's ``import tinycudann`` finds this package, so the worker sees ``tinn.torch``
as its parent does.
"""
