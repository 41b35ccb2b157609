"""Config keys: tcnn's names and defaults, and every key's validation (type, finiteness, range).

Every registered component declares its keys in one table (``KEYS``). The sweep below walks
those tables, so a key added later is checked automatically: each must reject values of the
wrong type, NaN / ±Inf and values outside its range with a ``ValueError`` that names the
component and the key.
"""
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import tinn
from tinn.registry import encodings, networks, optimizers

# tcnn's defaults, written out from the spec (not read from tinn's tables).
TCNN_DEFAULTS = {
    ("optimizer", "Adam"): {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "l2_reg": 1e-8,
                            "non_matrix_l2_reg": 0.0, "non_matrix_learning_rate_factor": 1.0, "relative_decay": 0.0,
                            "absolute_decay": 0.0, "adabound": False, "clipping_magnitude": 0.0,
                            "gradient_clipping_magnitude": 0.0, "optimize_matrix_params": True,
                            "optimize_non_matrix_params": True, "skip_zero_grad_non_matrix_params": True},
    ("optimizer", "SGD"): {"learning_rate": 1e-3, "l2_reg": 1e-8},
    ("optimizer", "Novograd"): {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8,
                                "relative_decay": 0.0, "absolute_decay": 0.0},
    ("optimizer", "Shampoo"): {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.99, "beta3": 0.9, "beta_shampoo": 0.9,
                               "epsilon": 1e-8, "identity": 0.01, "cg_on_momentum": True, "l2_reg": 1e-5,
                               "relative_decay": 0.0, "absolute_decay": 0.0, "frobenius_normalization": True},
    ("optimizer", "EMA"): {"decay": 0.99, "full_precision": False},
    ("optimizer", "Average"): {"n_samples": 128},
    ("optimizer", "Batched"): {"batch_size_multiplier": 16},
    ("optimizer", "ExponentialDecay"): {"decay_base": 0.1, "decay_start": 10000, "decay_interval": 10000,
                                        "decay_end": 10000000},
    ("optimizer", "Lookahead"): {"alpha": 0.5, "n_steps": 16},
    ("encoding", "Identity"): {"scale": 1.0, "offset": 0.0},
    ("encoding", "Frequency"): {"n_frequencies": 12},
    ("encoding", "TriangleWave"): {"n_frequencies": 12},
    ("encoding", "OneBlob"): {"n_bins": 16},
    ("encoding", "SphericalHarmonics"): {"degree": 4},
    ("encoding", "HashGrid"): {"type": "Hash", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 19,
                               "base_resolution": 16, "per_level_scale": 2.0, "interpolation": "Linear",
                               "hash": "CoherentPrime"},
    ("encoding", "NRC"): {"n_frequencies": 12, "n_bins": 4},
    ("network", "CutlassMLP"): {"n_neurons": 128, "n_hidden_layers": 5, "activation": "ReLU",
                                "output_activation": "None"},
}


def build(kind, config):
    """The component of ``config`` (small input sizes each component accepts)."""
    if kind == "optimizer":
        return tinn.create_optimizer(config)
    if kind == "network":
        return tinn.create_network(16, 1, config)
    n_in = {"SphericalHarmonics": 3, "NRC": 8}.get(config["otype"], 2)
    if config["otype"] == "Composite":
        config = {"nested": [{"otype": "Identity"}], **config}
    return tinn.create_encoding(n_in, config)


@pytest.mark.parametrize("kind, otype", list(TCNN_DEFAULTS), ids=[o for _, o in TCNN_DEFAULTS])
def test_defaults_are_tcnns(kind, otype):
    hp = build(kind, {"otype": otype}).hyperparams()
    want = TCNN_DEFAULTS[kind, otype]
    assert {k: hp[k] for k in want} == want
    assert set(hp) - {"otype", "nested"} == set(want)          # no key tcnn does not have


def _tables():
    """(kind, otype, key name, Key) for every key of every registered component."""
    out = []
    for kind, registry in (("encoding", encodings), ("network", networks), ("optimizer", optimizers)):
        seen = set()
        for name in registry.names():
            cls = registry._classes[name.lower()]
            if cls in seen:
                continue
            seen.add(cls)
            for key, spec in cls.KEYS.items():
                out.append(pytest.param(kind, name, key, spec, id=f"{name}.{key}"))
    return out


BAD_BY_TYPE = {
    float: [math.nan, math.inf, -math.inf, "0.5", True, None, [1.0]],
    int: [math.inf, -math.inf, math.nan, "64", True, 2.5, None, 2 ** 31, 2 ** 63, -(2 ** 63)],
    bool: [1, 0, "true", None, 0.5],
    str: [5, None, True, "NoSuchValue"],
    list: [5, "x", {"otype": "Identity"}],
}


@pytest.mark.parametrize("kind, otype, key, spec", _tables())
def test_every_key_rejects_bad_values_naming_component_and_key(kind, otype, key, spec):
    base = {"otype": otype}
    if key in ("n_features", "n_grid_features"):
        base = {"otype": otype}                                    # they exclude n_levels, which is not given
    for bad in BAD_BY_TYPE[spec.type]:
        if spec.type is str and not spec.choices and bad == "NoSuchValue":
            continue
        with pytest.raises(ValueError) as err:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                build(kind, {**base, key: bad})
        msg = str(err.value)
        assert f"'{key}'" in msg and otype.lower() in msg.lower(), (bad, msg)


@pytest.mark.parametrize("kind, config, key", [
    ("optimizer", {"otype": "Adam", "learning_rate": -1e-3}, "learning_rate"),
    ("optimizer", {"otype": "Adam", "beta1": 1.0}, "beta1"),
    ("optimizer", {"otype": "Adam", "l2_reg": -1.0}, "l2_reg"),
    ("optimizer", {"otype": "Adam", "relative_decay": -0.1}, "relative_decay"),
    ("optimizer", {"otype": "Adam", "clipping_magnitude": -1.0}, "clipping_magnitude"),
    ("optimizer", {"otype": "Adam", "epsilon": -1e-8}, "epsilon"),
    ("optimizer", {"otype": "SGD", "l2_reg": -1e-8}, "l2_reg"),
    ("optimizer", {"otype": "Lookahead", "alpha": 1.5}, "alpha"),
    ("optimizer", {"otype": "Lookahead", "n_steps": 0}, "n_steps"),
    ("optimizer", {"otype": "ExponentialDecay", "decay_base": -0.5}, "decay_base"),
    ("optimizer", {"otype": "ExponentialDecay", "decay_interval": 0}, "decay_interval"),
    ("optimizer", {"otype": "Ema", "decay": 1.0}, "decay"),
    ("optimizer", {"otype": "Shampoo", "identity": 2.0}, "identity"),
    ("optimizer", {"otype": "Batched", "batch_size_multiplier": 0}, "batch_size_multiplier"),
    ("optimizer", {"otype": "Average", "n_samples": 0}, "n_samples"),
    ("optimizer", {"otype": "Composite", "nested": [{"otype": "SGD", "n_params_to_optimize": -1}]},
     "n_params_to_optimize"),
    ("optimizer", {"otype": "Composite", "nested": [{"otype": "SGD", "n_params_to_optimize": math.inf}]},
     "n_params_to_optimize"),
    ("encoding", {"otype": "HashGrid", "per_level_scale": 1e30}, "per_level_scale"),
    ("encoding", {"otype": "HashGrid", "per_level_scale": 0.0}, "per_level_scale"),
    ("encoding", {"otype": "HashGrid", "n_features": 6, "n_features_per_level": 4}, "n_features"),
    ("encoding", {"otype": "HashGrid", "n_features": 1024}, "n_features"),
    ("encoding", {"otype": "OneBlob", "n_bins": 3}, "n_bins"),
    ("encoding", {"otype": "Composite", "nested": [{"otype": "Identity", "n_dims_to_encode": math.inf}]},
     "n_dims_to_encode"),
    ("network", {"otype": "CutlassMLP", "n_neurons": 0}, "n_neurons"),
    ("network", {"otype": "CutlassMLP", "n_hidden_layers": 10 ** 9}, "n_hidden_layers"),
    ("network", {"otype": "CutlassMLP", "n_hidden_layers": -1}, "n_hidden_layers"),
])
def test_out_of_range_values_name_the_key(kind, config, key):
    with pytest.raises(ValueError, match=f"'{key}'"):
        build(kind, config)


def test_integral_floats_and_numpy_numbers_are_accepted():
    net = tinn.create_network(np.int64(16), np.int32(2), {"n_neurons": 16.0, "n_hidden_layers": np.int64(1)},
                              n_instances=np.int64(2), seed=np.uint32(7))
    assert net.hyperparams()["n_neurons"] == 16 and type(net.hyperparams()["n_neurons"]) is int
    assert (net.n_input_dims, net.n_output_dims, net.n_instances) == (16, 2, 2)
    opt = tinn.create_optimizer({"otype": "Adam", "learning_rate": np.float32(0.5), "adabound": np.bool_(True)})
    assert opt.hyperparams()["learning_rate"] == 0.5 and opt.hyperparams()["adabound"] is True
    model = tinn.create_from_config(np.int64(2), np.int64(1), {"encoding": {"otype": "Identity"},
                                                               "network": {"n_neurons": 16, "n_hidden_layers": 1}},
                                    n_instances=np.int64(2))
    assert (model.network.n_input_dims, model.network.n_output_dims) == (2, 1)
    assert type(model.network.n_input_dims) is int


@pytest.mark.parametrize("kwargs, what", [
    ({"seed": None}, "seed"), ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"), ({"seed": "1"}, "seed"),
    ({"n_instances": 0}, "n_instances"), ({"n_instances": True}, "n_instances"),
    ({"n_instances": 2.0}, "n_instances"),
])
def test_factory_arguments_are_checked(kwargs, what):
    with pytest.raises(ValueError, match=what):
        tinn.create_from_config(2, 1, {"encoding": {"otype": "Identity"}}, **kwargs)


@pytest.mark.parametrize("dims", [(0, 1), (2, 0), (True, 1), (2.0, 1), ("2", 1), (2 ** 40, 1)])
def test_dimensions_are_checked(dims):
    with pytest.raises(ValueError, match="n_input_dims|n_output_dims"):
        tinn.create_from_config(*dims, {"encoding": {"otype": "Identity"}})


@pytest.mark.parametrize("section, value", [("network", 5), ("encoding", "HashGrid"), ("loss", ["L2"]),
                                            ("optimizer", None)])
def test_a_section_of_the_wrong_type_names_the_section(section, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "HashGrid").write_text("{}")           # a string section is never opened as a file
    with pytest.raises(ValueError, match=f"section '{section}'"):
        tinn.create_from_config(2, 1, {section: value})


def test_a_lone_empty_encoding_names_what_the_caller_passed():
    with pytest.raises(ValueError, match="'Empty' of the 6 input dims has no outputs"):
        tinn.create_from_config(6, 3, {"encoding": {"otype": "Empty"}})


def test_invalid_json_file_gives_line_and_column(tmp_path):
    for text, line, col in [('{\n  // comment\n  "a": 1,\n  "b": [1,\n}\n', 5, 1),
                            ('{\n  "a": 1 @\n}', 2, 10),
                            ('{"a": ', 1, None)]:
        path = tmp_path / "bad.json"
        path.write_text(text)
        with pytest.raises(ValueError) as err:
            tinn.create_from_config(2, 1, str(path))
        msg = str(err.value)
        assert msg.startswith(f"{path}: invalid JSON at line ") and "\x1b" not in msg and "Traceback" not in msg, msg
        if col is not None:
            assert f"line {line}, column {col}:" in msg, msg
        assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_config_with_comments_reads_as_the_same_config_without_them(tmp_path):
    plain = tinn.load_config("config_hash")
    text = json.dumps(plain, indent=1).replace('"encoding": {', '"encoding": { // the grid\n', 1)
    path = tmp_path / "commented.json"
    path.write_text("// tcnn's config_hash\n" + text + "\n// the end\n")
    assert "//" in path.read_text() and tinn.load_config(path) == plain


def test_plain_json_is_read_without_importing_commentjson_and_nan_is_still_refused(tmp_path):
    code = ("import sys, tinn; tinn.load_config('config_hash'); print('commentjson' in sys.modules); "
            "tinn.load_config(sys.argv[1])")
    path = tmp_path / "nan.json"
    path.write_text('{"optimizer": {"learning_rate": NaN}}')                   # NaN at column 33
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert run.stdout.strip().splitlines()[-1] == "False", run.stdout + run.stderr
    assert f"ValueError: {path}: invalid JSON at line 1, column 33" in run.stderr, run.stderr


def test_json_top_level_must_be_an_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        tinn.load_config(path)


def test_shipped_configs_still_load():
    configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tinn", "configs")
    names = sorted(name for name in os.listdir(configs) if name.endswith(".json"))
    assert len(names) >= 4
    for name in names:
        assert isinstance(tinn.load_config(os.path.join(configs, name)), dict)


@pytest.mark.parametrize("change", [{"learning_rate": math.nan}, {"nested": {"l2_reg": math.inf}},
                                    {"nested": {"beta1": "0.9"}}, {"decay": math.nan, "nested": {"beta1": 0.5}},
                                    {"nested": {"learning_rate": -1.0}}, {"decay": math.nan}])
def test_update_hyperparams_rejects_bad_values_and_changes_nothing(change):
    opt = tinn.create_optimizer({"otype": "Ema", "nested": {"otype": "Adam"}})
    before = opt.hyperparams()
    with pytest.raises(ValueError):
        opt.update_hyperparams(change)
    assert opt.hyperparams() == before
    with pytest.raises(ValueError, match="learning_rate"):
        opt.learning_rate = math.inf


def test_keys_are_documented_from_the_table():
    for cls in (tinn.optimizers.Adam, tinn.encodings.GridEncoding, tinn.networks.mlp.MLP):
        for key in cls.KEYS:
            assert f"``{key}``" in cls.__doc__, (cls, key)


def test_stacked_exponential_activations_warn():
    with pytest.warns(UserWarning, match="Exponential"):
        tinn.create_network(16, 1, {"n_neurons": 16, "n_hidden_layers": 3, "activation": "Exponential"})


def test_a_refused_update_changes_no_nested_optimizer_either():
    opt = tinn.create_optimizer({"otype": "Average", "n_samples": 4, "nested": {"otype": "Adam"}})
    opt.step(np.zeros((2, 1000), np.float32), np.ones((2, 1000), np.float32))
    before = opt.hyperparams()
    with pytest.raises(ValueError, match="'n_samples'"):
        opt.update_hyperparams({"n_samples": 2 ** 21, "nested": {"learning_rate": 0.5}})
    assert opt.hyperparams() == before
