"""Same seed, same data, same thread count: training is bit-identical run to run and process to process."""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.arch_independent("the training processes start ti.cpu whatever TINN_ARCH is")

TRAIN = """
    import hashlib
    import numpy as np
    import taichi as ti
    import tinn

    ti.init(arch=ti.cpu, log_level=ti.WARN)
    config = {
        "loss": {"otype": "RelativeL2"},
        "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15,
                      "l2_reg": 1e-6},
        "encoding": {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 15,
                     "base_resolution": 16, "per_level_scale": 1.5},
        "network": {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 64,
                    "n_hidden_layers": 2},
    }
    model = tinn.create_from_config(2, 3, config)
    rng = np.random.default_rng(5)
    for step in range(3):
        x = rng.random((65536, 2), dtype=np.float32)
        y = rng.random((65536, 3), dtype=np.float32)
        model.trainer.training_step(x, y)
    print("PARAMS", hashlib.sha256(model.trainer.params().tobytes()).hexdigest())
"""


def _train_in_new_process() -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(TRAIN)], capture_output=True, text=True,
                            timeout=600, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    return [line for line in result.stdout.splitlines() if line.startswith("PARAMS")][0]


def test_config_hash_training_is_bit_identical_across_processes():
    """Batch 65,536 (16 host blocks of the MLP, split along the samples): three Adam steps of config_hash in
    two processes give parameters with the same hash."""
    assert _train_in_new_process() == _train_in_new_process()
