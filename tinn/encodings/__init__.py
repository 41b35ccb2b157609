"""Encodings, one module per tcnn otype (see ``tinn.registry.encodings`` for the registry)."""
from .composite import CompositeEncoding, NRCEncoding
from .empty import EmptyEncoding
from .encoding import Encoding
from .frequency import FrequencyEncoding
from .grid import GridEncoding
from .identity import IdentityEncoding
from .oneblob import OneBlobEncoding
from .permutohedral import PermutohedralEncoding
from .spherical_harmonics import SphericalHarmonicsEncoding
from .triangle_wave import TriangleWaveEncoding

__all__ = ["CompositeEncoding", "EmptyEncoding", "Encoding", "FrequencyEncoding", "GridEncoding", "IdentityEncoding",
           "NRCEncoding", "OneBlobEncoding", "PermutohedralEncoding",
           "SphericalHarmonicsEncoding", "TriangleWaveEncoding"]
