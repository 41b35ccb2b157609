"""``python -m tinn.torch [--device cpu] SCRIPT [ARGS]``: run a tinycudann script unchanged on tinn.

``import tinycudann`` inside ``SCRIPT`` gives :mod:`tinn.torch` (:func:`tinn.torch.as_tinycudann`);
``SCRIPT`` runs as ``__main__`` with ``sys.argv = [SCRIPT, *ARGS]`` and its directory first on ``sys.path``,
as ``python SCRIPT ARGS`` would run it. Next on ``sys.path`` comes a folder whose ``tinycudann`` is
``tinn.torch`` (:mod:`tinn.torch._alias`), so worker processes the script starts with ``spawn``, which
re-import it in a fresh interpreter with this ``sys.path``, see ``tinycudann`` as ``tinn.torch`` too.

``--device cpu`` (opt-in) serves the script's requests for CUDA with the CPU for this run
(:func:`tinn.torch._cuda_on_cpu.cuda_on_cpu`): ``torch.device("cuda")``, ``.cuda()``, ``.to("cuda")``,
``device="cuda"`` arguments, ``torch.cuda.synchronize()``. Without it, a script that asks for CUDA on a
machine without CUDA stops with its error and a line naming the flag.

torch's CPU operations run on one thread unless the environment sets torch's threads (``OMP_NUM_THREADS``,
``MKL_NUM_THREADS``, ``OMP_WAIT_POLICY``); the script's own ``torch.set_num_threads(n)`` still wins. After
each multi-threaded operation torch's OpenMP threads keep spinning on the cores that tinn's Taichi kernels
need next: tcnn's PyTorch sample ran 2.5x slower on torch's default threads than on one (docs/torch.md).
"""
import contextlib
import os
import runpy
import shlex
import sys
import traceback

import torch

from . import as_tinycudann
from ._cuda_on_cpu import asks_for_missing_cuda, cuda_on_cpu

TORCH_THREAD_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")
USAGE = ("usage: python -m tinn.torch [--device cpu] SCRIPT [ARGS]  (runs SCRIPT with tinycudann as tinn.torch; "
         "--device cpu runs a script that asks for CUDA on the CPU)")


def _split(argv: list):
    """``(device, script, args)`` from ``[--device cpu | --device=cpu] SCRIPT ARGS``."""
    device = None
    if argv and argv[0].startswith("--device"):
        if argv[0] == "--device":
            device, argv = (argv[1] if len(argv) > 1 else ""), argv[2:]
        else:
            device, argv = argv[0].partition("=")[2], argv[1:]
        if device != "cpu":
            raise SystemExit(f"python -m tinn.torch: --device takes only 'cpu', not {device!r}\n{USAGE}")
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        raise SystemExit(0)
    if not argv:
        raise SystemExit(USAGE)
    return device, argv[0], argv[1:]


def main(argv: list) -> None:
    device, script, args = _split(list(argv))
    if not os.path.isfile(script):
        raise SystemExit(f"python -m tinn.torch: no such script: {script!r}")
    as_tinycudann()
    if not any(name in os.environ for name in TORCH_THREAD_SETTINGS):
        torch.set_num_threads(1)
    sys.argv = [script, *args]
    sys.path[:0] = [os.path.dirname(os.path.abspath(script)), os.path.join(os.path.dirname(__file__), "_alias")]
    with cuda_on_cpu() if device == "cpu" else contextlib.nullcontext():
        try:
            runpy.run_path(script, run_name="__main__")
        except Exception as e:
            if device is None and asks_for_missing_cuda(e):
                traceback.print_exc()
                raise SystemExit(f"python -m tinn.torch: {script} asks for CUDA, which this machine does not "
                                 "have; run it on the CPU with --device cpu: python -m tinn.torch --device cpu "
                                 f"{shlex.join([script, *args])}") from None
            raise


if __name__ == "__main__":
    main(sys.argv[1:])
