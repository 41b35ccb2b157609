"""``python -m tinn.torch SCRIPT [ARGS]``: run a tinycudann script unchanged on tinn.

``import tinycudann`` inside ``SCRIPT`` gives :mod:`tinn.torch` (:func:`tinn.torch.as_tinycudann`);
``SCRIPT`` runs as ``__main__`` with ``sys.argv = [SCRIPT, *ARGS]`` and its directory first on ``sys.path``,
as ``python SCRIPT ARGS`` would run it.
"""
import os
import runpy
import sys

from . import as_tinycudann


def main(argv: list) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        raise SystemExit("usage: python -m tinn.torch SCRIPT [ARGS]  (runs SCRIPT with tinycudann as tinn.torch)")
    script = argv[0]
    if not os.path.isfile(script):
        raise SystemExit(f"python -m tinn.torch: no such script: {script!r}")
    as_tinycudann()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
