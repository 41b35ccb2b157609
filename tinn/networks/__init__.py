"""Networks (see ``tinn.registry.networks`` for the registry)."""
from .mlp import MLP
from .network import Network

__all__ = ["MLP", "Network"]
