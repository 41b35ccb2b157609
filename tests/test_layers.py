"""The package's floors: no module imports one that (directly or not) imports it back.

Registries and factories (``tinn.registry``) sit below the components; ``tinn.config``
(``create_from_config``) sits above the model and trainer it wires. Imports inside functions
count too: a lazy import hides a circle from Python, not from a reader.
"""
import ast
import os

import tinn

ROOT = os.path.dirname(tinn.__file__)


def import_graph() -> dict:
    modules = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = ".".join(["tinn"] + os.path.relpath(path, ROOT)[:-3].split(os.sep))
                modules[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(parts + ([node.module] if node.module else []))
                if node.module and target in modules:
                    deps.add(target)
                deps.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules)
        graph[name] = deps
    return graph


def reaches(graph, start, goal, seen=None) -> bool:
    seen = set() if seen is None else seen
    for dep in graph[start]:
        if dep == goal or (dep not in seen and not seen.add(dep) and reaches(graph, dep, goal, seen)):
            return True
    return False


def test_no_import_circle():
    graph = import_graph()
    assert "tinn.registry" in graph and "tinn.config" in graph
    circles = sorted(m for m in graph if reaches(graph, m, m))
    assert circles == []


def test_the_registry_is_on_the_ground_floor():
    graph = import_graph()
    assert not reaches(graph, "tinn.registry", "tinn.object")
    assert not reaches(graph, "tinn.registry", "tinn.config")
    assert reaches(graph, "tinn.config", "tinn.trainer")
