"""tinn.torch second order: a loss on the input gradient (Eikonal-style) backpropagates through
``backward_backward_input`` into the parameters and the inputs."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tinn.torch needs torch (pip install -e '.[test]' installs it)")

import tinn.torch as tt  # noqa: E402
from test_torch import ENCODINGS, KINKED, SMOOTH_NET  # noqa: E402
from torch_checks import check_second_order  # noqa: E402


@pytest.fixture
def x(rng):
    return torch.from_numpy(rng.random((8, 3), dtype=np.float32))


SECOND_ORDER = ["Frequency", "Identity", "OneBlob", "SphericalHarmonics", "TriangleWave"]


@pytest.mark.parametrize("family", SECOND_ORDER)
def test_model_second_order_matches_finite_differences(x, family):
    torch.manual_seed(0)
    model = tt.NetworkWithInputEncoding(3, 2, ENCODINGS[family], SMOOTH_NET)
    check_second_order(model, x, h=KINKED.get(family, 1e-3))


def test_encoding_and_network_second_order_match_finite_differences(x):
    check_second_order(tt.Encoding(3, ENCODINGS["Frequency"]), x)
    check_second_order(tt.Network(3, 4, SMOOTH_NET), x)


def test_routed_array_second_order_matches_finite_differences(x):
    model = tt.NetworkWithInputEncoding(3, 2, ENCODINGS["Frequency"], SMOOTH_NET, n_instances=3)
    check_second_order(model, x, instance=torch.tensor([0, 2, 2, 1, 0, 2, 1, 1]))


def test_eikonal_training_reduces_the_gradient_norm_error(rng):
    """An SDF-style fit: ||dy/dx|| pushed towards 1 by a torch optimizer through second derivatives."""
    model = tt.NetworkWithInputEncoding(3, 1, ENCODINGS["Frequency"], SMOOTH_NET)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    errors = []
    for _ in range(30):
        x = torch.from_numpy(rng.random((256, 3), dtype=np.float32)).requires_grad_(True)
        g = torch.autograd.grad(model(x).sum(), x, create_graph=True)[0]
        loss = (g.norm(dim=1) - 1).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        errors.append(loss.item())
    assert np.mean(errors[-5:]) < 0.2 * np.mean(errors[:5])


def test_a_loss_on_the_parameter_gradient_is_refused(x):
    model = tt.Network(3, 2, SMOOTH_NET)
    (g,) = torch.autograd.grad(model(x).sum(), model.params, create_graph=True)
    with pytest.raises(RuntimeError, match="parameter gradient"):
        g.square().sum().backward()
