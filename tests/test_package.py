"""The package as users install it: tcnn's standard configs inside it, loadable by name from any directory;
the wheel's files and metadata; nothing noisy on import."""
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

import tinn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = ("config", "config_hash", "config_network_array", "config_oneblob")

# tcnn's data/config_hash.json, as published in NVlabs/tiny-cuda-nn
TCNN_CONFIG_HASH = {
    "loss": {"otype": "RelativeL2"},
    "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15,
                  "l2_reg": 1e-6},
    "encoding": {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 15,
                 "base_resolution": 16, "per_level_scale": 1.5, "fixed_point_pos": False},
    "network": {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 64,
                "n_hidden_layers": 2},
}


def test_tcnns_config_hash_loads_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert tinn.load_config("config_hash") == TCNN_CONFIG_HASH
    assert tinn.load_config("config_hash.json") == TCNN_CONFIG_HASH


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_builds_a_model_by_name(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tinn.load_config(name)
    assert {"loss", "optimizer", "encoding", "network"} <= set(config)
    by_name, by_dict = tinn.create_from_config(2, 3, name), tinn.create_from_config(2, 3, config)
    assert by_name.network.hyperparams() == by_dict.network.hyperparams()
    assert by_name.trainer.hyperparams() == by_dict.trainer.hyperparams()


def test_a_path_still_loads_that_file(tmp_path, monkeypatch):
    """A file wins over a shipped name: ``config_hash.json`` in the working directory is that file."""
    (tmp_path / "config_hash.json").write_text('// mine\n{"network": {"n_neurons": 16}}')
    monkeypatch.chdir(tmp_path)
    assert tinn.load_config("config_hash.json") == {"network": {"n_neurons": 16}}
    assert tinn.load_config(tmp_path / "config_hash.json") == {"network": {"n_neurons": 16}}
    assert tinn.load_config("config_hash") == TCNN_CONFIG_HASH


@pytest.mark.parametrize("config", ["config_hsah", "data/config_hash.json", "configs/config_hash"])
def test_neither_a_file_nor_a_shipped_name_lists_the_shipped_names(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="shipped: config, config_hash, config_network_array, config_oneblob"):
        tinn.load_config(config)


def test_version_is_the_installed_distributions():
    from importlib import metadata
    try:
        expected = metadata.version("tinn")
    except metadata.PackageNotFoundError:
        expected = "0+unknown"
    assert tinn.__version__ == expected


PACKAGING = pytest.mark.x64_only("builds and installs the wheel; nothing device-specific")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built, offline, from a copy of the package's sources (the checkout stays clean)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(os.path.join(ROOT, name), src)
    shutil.copytree(os.path.join(ROOT, "tinn"), src / "tinn", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(dist), str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (path,) = dist.glob("tinn-*.whl")
    return path


@PACKAGING
def test_the_wheel_holds_the_configs_and_every_module(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in SHIPPED:
        assert f"tinn/configs/{name}.json" in names
    assert "tinn/deploy/tinn_model.h" in names                     # tinn.deploy's C header
    sources = {os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/")
               for d, _, files in os.walk(os.path.join(ROOT, "tinn")) for f in files if f.endswith((".py", ".json"))}
    assert sources <= names, sorted(sources - names)
    assert not [n for n in names if not n.startswith(("tinn/", "tinn-"))], "the wheel installs only tinn"


@PACKAGING
def test_the_wheel_metadata_names_home_page_authors_classifiers_and_pythons(wheel):
    z = zipfile.ZipFile(wheel)
    (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
    lines = z.read(meta).decode().split("\n\n")[0].splitlines()
    fields = {}
    for line in lines:
        key, _, value = line.partition(": ")
        fields.setdefault(key, []).append(value)
    assert any(v.startswith("Homepage, https://") for v in fields["Project-URL"])
    assert fields["Home-page"][0].startswith("https://")          # what pip show prints, whatever pip's version
    assert fields["Author"] and fields["Author"][0]
    assert fields["Requires-Python"] == [">=3.10"]
    assert "Programming Language :: Python :: 3.10" in fields["Classifier"]
    assert "License :: OSI Approved :: BSD License" in fields["Classifier"]
    runtime = sorted(v.split("<")[0].split(">")[0].split("=")[0] for v in fields["Requires-Dist"] if "extra" not in v)
    assert runtime == ["commentjson", "imageio", "numpy", "taichi"]


@PACKAGING
def test_the_installed_wheel_loads_configs_by_name_outside_the_checkout(wheel, tmp_path):
    """Installed (not editable) and used from another directory: the version is the wheel's, and the
    README's first lines run."""
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                           str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    work = tmp_path / "work"
    work.mkdir()
    script = textwrap.dedent("""
        import taichi as ti, tinn
        assert tinn.__file__.startswith(SITE), tinn.__file__
        ti.init(arch=ti.cpu, log_level=ti.WARN)
        model = tinn.create_from_config(2, 3, "config_hash")
        print(tinn.__version__, model.network.n_params)
    """).replace("SITE", repr(str(site)))
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("TINN_ARCH", None)
    run = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    version = wheel.name.split("-")[1]
    assert run.stdout.split()[-2:] == [version, "715536"]          # tcnn's parameter count for config_hash
    assert os.listdir(work) == []


@pytest.mark.x64_only("a subprocess on the CPU; warnings are not device-specific")
def test_importing_tinn_initialising_taichi_and_calling_tinn_torch_warn_nothing():
    """Every warning shown: importing tinn (after taichi), ``ti.init`` twice, a tinn.torch call and its backward."""
    pytest.importorskip("torch")
    script = textwrap.dedent("""
        import warnings
        import taichi as ti, torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import tinn, tinn.torch as tt
            ti.init(arch=ti.cpu, log_level=ti.WARN)
            ti.init(arch=ti.cpu, log_level=ti.WARN)
            model = tt.Network(2, 3, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1})
            model(torch.rand(8, 2)).sum().backward()
            ti.init(arch=ti.cpu, log_level=ti.WARN)
        for w in caught:
            print("WARNING", w.category.__name__, w.filename, w.message)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TINN_ARCH", None)
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "WARNING" not in run.stdout, run.stdout
