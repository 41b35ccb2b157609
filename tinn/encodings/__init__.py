"""Encodings, one module per tcnn otype (see ``tinn.config.encodings`` for the registry)."""
from .encoding import Encoding
from .frequency import FrequencyEncoding
from .grid import GridEncoding
from .identity import IdentityEncoding
from .oneblob import OneBlobEncoding
from .triangle_wave import TriangleWaveEncoding

__all__ = ["Encoding", "FrequencyEncoding", "GridEncoding", "IdentityEncoding", "OneBlobEncoding", "TriangleWaveEncoding"]
