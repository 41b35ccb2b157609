"""A NeRF field as torch-ngp builds it with tinycudann: a hash-grid density network with 15 geometric
features and a spherical-harmonics colour network, trained a few steps on a toy radiance target."""
import sys

import numpy as np
import torch
import tinycudann as tcnn

steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 30
torch.manual_seed(0)

encoder = tcnn.Encoding(3, {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 12,
                            "base_resolution": 16, "per_level_scale": 1.3819})
sigma_net = tcnn.Network(encoder.n_output_dims, 1 + 15, {"otype": "FullyFusedMLP", "activation": "ReLU",
                                                         "output_activation": "None", "n_neurons": 64,
                                                         "n_hidden_layers": 1})
encoder_dir = tcnn.Encoding(3, {"otype": "SphericalHarmonics", "degree": 4})
color_net = tcnn.Network(encoder_dir.n_output_dims + 15, 3, {"otype": "FullyFusedMLP", "activation": "ReLU",
                                                             "output_activation": "None", "n_neurons": 64,
                                                             "n_hidden_layers": 2})
# tinycudann's counts: inputs padded to 16 with ones, outputs to 16
assert sigma_net.params.numel() == 16 * 64 + 64 * 16 == 2048, sigma_net.params.numel()
assert color_net.params.numel() == 32 * 64 + 64 * 64 + 64 * 16 == 7168, color_net.params.numel()
assert encoder_dir.n_output_dims == 16


def field(x, d):
    h = sigma_net(encoder(x))
    sigma = torch.exp(h[..., 0])
    color = torch.sigmoid(color_net(torch.cat([encoder_dir((d + 1) / 2), h[..., 1:]], dim=-1)))
    return sigma, color


x = torch.rand(256, 3)
d = torch.nn.functional.normalize(torch.randn(256, 3), dim=-1)
target = torch.stack([x[:, 0], x[:, 1] * d[:, 2].abs(), x[:, 2]], dim=-1)
params = list(encoder.parameters()) + list(sigma_net.parameters()) + list(color_net.parameters())
optimizer = torch.optim.Adam(params, lr=1e-2, eps=1e-15)
losses = []
for _ in range(steps):
    sigma, color = field(x, d)
    loss = ((color - target) ** 2).mean() + 1e-3 * sigma.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0], losses
print(f"nerf: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
