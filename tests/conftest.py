"""One Taichi runtime for the whole session (CPU unless TINN_ARCH says otherwise)."""
import os

import numpy as np
import pytest
import taichi as ti


def pytest_configure(config):
    arch = getattr(ti, os.environ.get("TINN_ARCH", "cpu"))
    ti.init(arch=arch, offline_cache=True, log_level=ti.WARN)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
