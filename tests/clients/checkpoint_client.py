"""A checkpoint written for tinycudann (a flat ``params`` of tinycudann's size) loaded into a module: for
31 inputs and a 64x2 FullyFusedMLP that is 7168 parameters; the outputs are the checkpoint's network's."""
import os
import sys
import tempfile

import torch
import tinycudann as tcnn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dense_mlp  # noqa: E402

config = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 64,
          "n_hidden_layers": 2}
torch.manual_seed(3)
saved = {"params": torch.randn(7168) * 0.2}
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model.pth")
    torch.save(saved, path)
    model = tcnn.Network(31, 4, config)
    model.load_state_dict(torch.load(path))
x = torch.rand(64, 31)
with torch.no_grad():
    y = model(x)
want = dense_mlp.forward(x, dense_mlp.matrices(saved["params"], dense_mlp.shapes(31, 4, 64, 2)), 4)
assert torch.allclose(y.double(), want, atol=1e-4 * float(want.abs().max())), float((y.double() - want).abs().max())
print("checkpoint: 7168 parameters loaded, outputs match")
