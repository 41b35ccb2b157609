"""A float64 PyTorch MLP read from tinycudann's flat ``params`` (the reference the client scripts check
against): tinycudann's ``Network`` pads the inputs to a multiple of 16 with ones and the outputs to a
multiple of 16; its matrices are stored one after another, each row-major ``(out, in)``.
"""
import torch
import torch.nn.functional as F


def padded(n: int) -> int:
    return (n + 15) // 16 * 16


def shapes(n_in: int, n_out: int, n_neurons: int, n_hidden_layers: int) -> list:
    widths = [padded(n_in)] + [n_neurons] * n_hidden_layers + [padded(n_out)]
    return list(zip(widths[1:], widths[:-1]))


def matrices(params: torch.Tensor, layer_shapes: list) -> list:
    """The weight matrices of ``params`` (any dtype; differentiable) in float64."""
    out, offset = [], 0
    for rows, cols in layer_shapes:
        out.append(params[offset:offset + rows * cols].double().reshape(rows, cols))
        offset += rows * cols
    assert offset == params.numel(), (offset, params.numel())
    return out


def forward(x: torch.Tensor, Ws: list, n_out: int, activation: str = "ReLU") -> torch.Tensor:
    """``y = W_L act(... act(W_0 [x, 1, ..., 1]))[:, :n_out]`` in float64."""
    act = {"ReLU": F.relu, "Softplus": lambda z: F.softplus(z, beta=10)}[activation]
    h = x.double()
    h = torch.cat([h, torch.ones(len(h), Ws[0].shape[1] - h.shape[1], dtype=h.dtype)], dim=1)
    for W in Ws[:-1]:
        h = act(h @ W.T)
    return (h @ Ws[-1].T)[:, :n_out]
