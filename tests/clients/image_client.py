"""tinycudann's ``samples/mlp_learning_an_image_pytorch.py`` at a tiny size: a hash-grid network learns a
synthetic 32x32 image from random bilinear lookups; ``--steps N``."""
import argparse

import torch
import tinycudann as tcnn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()

config = {"loss": {"otype": "RelativeL2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
          "encoding": {"otype": "HashGrid", "n_levels": 8, "n_features_per_level": 2, "log2_hashmap_size": 12,
                       "base_resolution": 4, "per_level_scale": 1.5},
          "network": {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None",
                      "n_neurons": 32, "n_hidden_layers": 2}}
device = torch.device("cpu")
u = torch.linspace(0, 1, 32)
image = torch.stack(torch.meshgrid(u, u, indexing="ij") + (torch.sin(6 * u)[:, None] * u[None, :],), dim=-1)


def lookup(xs):
    p = xs * 31
    i = p.long().clamp(max=30)
    f = p - i
    c = lambda a, b: image[i[:, 0] + a, i[:, 1] + b]
    return ((1 - f[:, :1]) * ((1 - f[:, 1:]) * c(0, 0) + f[:, 1:] * c(0, 1))
            + f[:, :1] * ((1 - f[:, 1:]) * c(1, 0) + f[:, 1:] * c(1, 1)))


model = tcnn.NetworkWithInputEncoding(n_input_dims=2, n_output_dims=3, encoding_config=config["encoding"],
                                      network_config=config["network"]).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
torch.manual_seed(0)
first = None
for i in range(args.steps):
    batch = torch.rand([512, 2], device=device, dtype=torch.float32)
    targets = lookup(batch)
    output = model(batch)
    relative_l2_error = (output - targets.to(output.dtype)) ** 2 / (output.detach() ** 2 + 0.01)
    loss = relative_l2_error.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    first = loss.item() if first is None else first
assert loss.item() < 0.5 * first, (first, loss.item())
print(f"image: loss {first:.4f} -> {loss.item():.4f}")
