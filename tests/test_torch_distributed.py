"""Training across processes: examples/distributed_image.py on 2 gloo processes (launched with torchrun)
ends with the parameters that one process reaches on the whole batch, data parallel and sharded by
instance."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="distributed training needs torch (pip install -e '.[test]' installs it)")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch build has no gloo backend for torch.distributed", allow_module_level=True)

import tinn.torch as tt  # noqa: E402
from tinn.torch.distributed import shard_range  # noqa: E402
from test_examples import ROOT  # noqa: E402
from mlp_learning_an_image import load_image  # noqa: E402
from mlp_learning_an_image_pytorch import Image  # noqa: E402

IMAGE = os.path.join(ROOT, "data", "images", "default.jpg")
CONFIG = {"loss": {"otype": "RelativeL2"},
          "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15},
          "encoding": {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 12,
                       "base_resolution": 8, "per_level_scale": 2.0},
          "network": {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 16,
                      "n_hidden_layers": 1}}
STEPS, BATCH, SEED = 3, 2048, 5


def run_example(tmp_path, nproc: int, *extra) -> np.ndarray:
    config, out = tmp_path / "config.json", tmp_path / f"params_{nproc}.npz"
    config.write_text(json.dumps(CONFIG))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(ROOT, "examples", "distributed_image.py"), IMAGE, str(config), "--steps", str(STEPS),
           "--batch", str(BATCH), "--seed", str(SEED), "--save", str(out), *extra]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES=""))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "Final PSNR" in result.stdout
    return np.load(out)["params"]


def train_in_one_process(n_instances: int) -> np.ndarray:
    """The example's steps on the whole batch in this process, with an unsharded module (torch on one thread,
    as torchrun's processes run it: ``one_torch_thread``)."""
    image = Image(load_image(IMAGE), "cpu")
    model = tt.NetworkWithInputEncoding(2, 3, CONFIG["encoding"], CONFIG["network"], seed=SEED,
                                        n_instances=n_instances or 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.99), eps=1e-15)
    generator = torch.Generator().manual_seed(SEED)
    for _ in range(STEPS):
        batch = torch.rand([BATCH, 2], generator=generator)
        if n_instances:
            output = model(batch, instance=(batch[:, 1] * n_instances).long().clamp(max=n_instances - 1))
        else:
            output = model(batch)
        loss = ((output - image(batch)) ** 2 / (output.detach() ** 2 + 0.01)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.params.detach().numpy()


def test_shard_ranges_cover_the_networks_contiguously():
    for K, N in [(3, 2), (10, 4), (7, 7), (100000, 3)]:
        ranges = [shard_range(K, r, N) for r in range(N)]
        assert ranges[0][0] == 0 and ranges[-1][1] == K
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [hi - lo for lo, hi in ranges]
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.full_only("two torchrun processes; the default suite checks the shard ranges here and tinn.torch in "
                       "test_torch")
def test_data_parallel_on_two_processes_equals_one_process(tmp_path, one_torch_thread):
    two = run_example(tmp_path, 2)
    np.testing.assert_allclose(two, train_in_one_process(0), rtol=1e-4, atol=1e-6)


@pytest.mark.full_only("a second pair of torchrun processes; the data-parallel test checks the same launch by default")
def test_instance_sharded_array_on_two_processes_equals_one_process(tmp_path, one_torch_thread):
    two = run_example(tmp_path, 2, "--instances", "3")            # ranks own networks [0, 1) and [1, 3)
    one = train_in_one_process(3)
    assert two.shape == one.shape == (3, one.shape[1])
    np.testing.assert_allclose(two, one, rtol=1e-4, atol=1e-6)
    assert not np.allclose(two[0], two[1])
