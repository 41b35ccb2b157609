"""The network base class (tcnn ``network.h``)."""
from __future__ import annotations

from ..object import DifferentiableObject
from ..runtime.memory import next_multiple

OUTPUT_ALIGNMENT = 16


class Network(DifferentiableObject):
    """Maps ``n_input_dims`` to ``n_output_dims``; outputs are computed padded to a multiple of 16."""

    def __init__(self, n_input_dims: int, n_output_dims: int, *, n_instances: int = 1, seed: int = 1337):
        super().__init__(n_instances, seed)
        self.n_input_dims, self.n_output_dims = n_input_dims, n_output_dims
        self.padded_output_width = next_multiple(n_output_dims, OUTPUT_ALIGNMENT)

    def _runs_encoding(self, encoding, batch) -> bool:
        """Whether this network's inference of ``batch`` can run ``encoding`` inside its own launch
        (``_inference(x, batch, encoding=...)`` with ``x`` the encoding's input); none can by default."""
        return False
