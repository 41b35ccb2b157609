"""tinn.torch as tinycudann: every way of writing ``params`` reaches the next call, a call that changed
nothing copies nothing; ``Network``'s layout, the native module's methods, ``jit_fusion`` and ``dtype``.

Outputs are checked against a float64 PyTorch copy of the network built from ``params``
(``tests/clients/dense_mlp.py``: inputs padded to 16 with ones, matrices row-major)."""
import copy
import os
import pickle
import sys

import pytest

torch = pytest.importorskip("torch")
import tinn.torch as tt  # noqa: E402
from tinn.torch import modules  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "clients"))
import dense_mlp  # noqa: E402

NET = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 16,
       "n_hidden_layers": 1}
SHAPES = dense_mlp.shapes(3, 2, 16, 1)


def _check(model, x):
    """Training and inference forwards equal the reference at ``model.params``' current values."""
    want = dense_mlp.forward(x, dense_mlp.matrices(model.params.detach(), SHAPES), 2)
    with torch.no_grad():
        inferred = model(x)
    trained = model(x)
    for got in (inferred, trained):
        assert torch.allclose(got.double(), want, atol=1e-5 * float(want.abs().max()))


def _new(seed):
    return torch.randn(sum(r * c for r, c in SHAPES), generator=torch.Generator().manual_seed(seed))


def _optimizer_step(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.params.grad = _new(9)
    optimizer.step()


WRITES = {
    ".data.copy_": lambda m: m.params.data.copy_(_new(1)),
    ".data slice": lambda m: m.params.data[:40].mul_(-2.0),
    ".data =": lambda m: setattr(m.params, "data", _new(2)),
    "no_grad copy_": lambda m: torch.no_grad()(m.params.copy_)(_new(3)),
    "nn.init": lambda m: torch.nn.init.uniform_(m.params, -0.5, 0.5),
    "load_state_dict": lambda m: m.load_state_dict({"params": _new(4)}),
    "optimizer": _optimizer_step,
    "detach().copy_": lambda m: m.params.detach().copy_(_new(5)),
}


def test_every_write_reaches_the_next_call_and_an_unchanged_call_copies_nothing(monkeypatch):
    copies = []
    real = modules.write_params
    monkeypatch.setattr(modules, "write_params", lambda native, p: (copies.append(1), real(native, p)))
    model = tt.Network(3, 2, NET, seed=5)
    x = torch.rand(64, 3, generator=torch.Generator().manual_seed(0))
    _check(model, x)
    assert copies == []                              # the native object starts with params' values
    for name, write in WRITES.items():
        write(model)
        _check(model, x)
        assert len(copies) == 1, name                # one copy after a write, none for the unchanged calls
        copies.clear()
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        clone.params.data.copy_(_new(7))             # a copy's params track their own native object
        _check(clone, x)
    shared = tt.Network(3, 2, NET, seed=6)           # another module holding the same tensor
    shared.params = model.params
    with torch.no_grad():
        model.params.mul_(0.5)
    _check(shared, x)
    _check(model, x)


@pytest.mark.x64_only("parameter counts; nothing device-specific")
@pytest.mark.parametrize("otype", ["FullyFusedMLP", "CutlassMLP"])
def test_network_has_tinycudanns_parameter_count(otype):
    config = {"otype": otype, "n_neurons": 64, "n_hidden_layers": 2}
    counts = {n_in: tt.Network(n_in, 1, config).n_params for n_in in (31, 35, 3)}
    assert counts == {31: 7168, 35: 8192, 3: 6144}   # tinycudann's figures (issue 25)


@pytest.mark.x64_only("torch-level attributes; nothing device-specific")
def test_native_module_methods_jit_fusion_and_dtype():
    model = tt.Network(3, 2, NET, seed=11)
    native = model.native_tcnn_module
    assert (native.n_input_dims(), native.n_output_dims(), native.n_params()) == (3, 2, model.params.numel())
    assert native.param_precision() == native.output_precision() == tt.Precision.Fp32
    assert torch.equal(native.initial_params(11), model.params.detach())
    assert not torch.equal(native.initial_params(12), model.params.detach())
    assert native.hyperparams() == model.hyperparams() and native.name() == model.hyperparams()["otype"]
    assert model.jit_fusion is False
    model.jit_fusion = True
    assert model.jit_fusion is True
    with pytest.raises(AttributeError):
        del model.jit_fusion
    grid = {"otype": "Frequency", "n_frequencies": 2}
    assert tt.Encoding(3, grid, dtype=torch.float16).dtype == torch.float16
    assert tt.Encoding(3, grid).dtype == torch.float32
    assert tt.Encoding(3, grid, dtype=torch.float16)(torch.rand(4, 3)).dtype == torch.float16
