"""An SDF as instant-nsr-pl builds it with tinycudann: a network initialised to a sphere through
``params.data`` (its ``sphere_init_tcnn_network``), then trained with an Eikonal term through double
backward; every value and gradient is checked against a float64 PyTorch copy of the network."""
import math
import os
import sys

import torch
import tinycudann as tcnn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dense_mlp  # noqa: E402

steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 5
config = {"otype": "FullyFusedMLP", "activation": "Softplus", "output_activation": "None", "n_neurons": 32,
          "n_hidden_layers": 2}
n_in, n_out, radius = 3, 1, 0.5
network = tcnn.Network(n_in, n_out, config)
layer_shapes = dense_mlp.shapes(n_in, n_out, config["n_neurons"], config["n_hidden_layers"])


def sphere_init_tcnn_network(network):
    """Geometric initialisation of the padded layers, flattened and copied into ``params.data``."""
    torch.manual_seed(0)
    data = []
    for i, (rows, cols) in enumerate(layer_shapes):
        w = torch.zeros(rows, cols)
        if i == len(layer_shapes) - 1:
            w[:n_out] = math.sqrt(math.pi) / math.sqrt(cols) + 1e-4 * torch.randn(n_out, cols)
        elif i == 0:
            w[:, :n_in] = torch.randn(rows, n_in) * math.sqrt(2) / math.sqrt(rows)
            w[:, n_in] = -radius * 0.1          # a padded input column is 1: a bias
        else:
            w = torch.randn(rows, cols) * math.sqrt(2) / math.sqrt(rows)
        data.append(w.flatten())
    new_data = torch.cat(data)
    assert new_data.shape == network.params.data.shape, (new_data.shape, network.params.shape)
    network.params.data.copy_(new_data)
    return new_data


initial = sphere_init_tcnn_network(network)
x = (torch.rand(128, 3) * 2 - 1).requires_grad_(True)
with torch.no_grad():
    y = network(x.detach())
want = dense_mlp.forward(x.detach(), dense_mlp.matrices(initial, layer_shapes), n_out, "Softplus")
assert torch.allclose(y.double(), want, atol=1e-5), float((y.double() - want).abs().max())

optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)
for step in range(steps):
    sdf = network(x)
    grad = torch.autograd.grad(sdf.sum(), x, create_graph=True)[0]
    loss = (sdf ** 2).mean() + 0.1 * ((grad.norm(dim=-1) - 1) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    # the same loss on a float64 copy of the parameters
    p64 = network.params.detach().double().requires_grad_(True)
    x64 = x.detach().double().requires_grad_(True)
    sdf64 = dense_mlp.forward(x64, dense_mlp.matrices(p64, layer_shapes), n_out, "Softplus")
    grad64 = torch.autograd.grad(sdf64.sum(), x64, create_graph=True)[0]
    loss64 = (sdf64 ** 2).mean() + 0.1 * ((grad64.norm(dim=-1) - 1) ** 2).mean()
    loss64.backward()
    scale = float(p64.grad.abs().max())
    assert abs(loss.item() - loss64.item()) < 1e-4 * max(1.0, loss64.item()), (step, loss.item(), loss64.item())
    assert torch.allclose(network.params.grad.double(), p64.grad, atol=1e-3 * scale), step
    assert torch.allclose(x.grad.double(), x64.grad, atol=1e-3 * float(x64.grad.abs().max())), step
    x.grad = None
    optimizer.step()
print(f"sdf: Eikonal loss {loss.item():.5f} matches float64 {loss64.item():.5f}")
