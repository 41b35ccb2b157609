"""Optimizers, one file per tcnn otype (see ``tinn.registry.optimizers`` for the registry).

Leaf optimizers: ``SGD``, ``Adam``, ``Novograd``, ``Shampoo``. Wrappers around a
``nested`` optimizer: ``EMA``, ``Average``, ``Batched``, ``ExponentialDecay``,
``Lookahead``, and ``Composite`` (a list of nested optimizers on parameter slices).
"""
from .adam import Adam
from .average import Average
from .batched import Batched
from .composite import Composite
from .ema import EMA
from .exponential_decay import ExponentialDecay
from .lookahead import Lookahead
from .novograd import Novograd
from .optimizer import Optimizer
from .sgd import SGD
from .shampoo import Shampoo
from .wrapper import Wrapper

__all__ = ["Adam", "Average", "Batched", "Composite", "EMA", "ExponentialDecay", "Lookahead", "Novograd", "Optimizer",
           "SGD", "Shampoo", "Wrapper"]
