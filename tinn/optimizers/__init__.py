"""Optimizers (see ``tinn.config.optimizers`` for the registry)."""
from .adam import Adam
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Adam", "Optimizer", "SGD"]
