"""``import tinycudann`` in a worker spawned by a script run with ``python -m tinn.torch``: gives :mod:`tinn.torch`
(this module replaces itself in ``sys.modules``, so ``tinycudann`` and ``tinycudann.modules`` are tinn's)."""
from tinn.torch import as_tinycudann

as_tinycudann()
