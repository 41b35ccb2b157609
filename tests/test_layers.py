"""The package's floors, as ``docs/architecture.md`` states them: a module imports only from its own floor
or the floors below, and no module imports one that (directly or not) imports it back.

The floors are read from the document's table (``## The layers``), so the table and the code cannot
drift apart: a new module must be placed in it, and an import that climbs a floor fails here. Imports
inside functions count too: a lazy import hides a circle from Python, not from a reader.
"""
import ast
import os
import re

import tinn

ROOT = os.path.dirname(tinn.__file__)
DOC = os.path.join(os.path.dirname(ROOT), "docs", "architecture.md")


def module_paths() -> list:
    return [os.path.join(folder, f) for folder, _, files in os.walk(ROOT) for f in files if f.endswith(".py")]


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


def doc_floors() -> list:
    """``[(floor name, [module patterns])]`` from the table, bottom floor first: ``x.py`` names ``tinn.x``,
    ``dir/`` the package ``tinn.dir`` and everything in it, ``__init__.py`` the package ``tinn``."""
    text = open(DOC, encoding="utf-8").read()
    table = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    floors = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("floor", "") or set(cells[0]) <= set("-"):
            continue
        floors.append((cells[0], re.findall(r"`([\w/.]+(?:\.py|/))`", cells[1])))
    return floors


def floor_of(module: str, floors: list) -> list:
    """The indices of the floors whose patterns name ``module``."""
    found = []
    for i, (_, patterns) in enumerate(floors):
        for p in patterns:
            if p == "__init__.py":
                hit = module == "tinn"
            elif p.endswith("/"):
                package = "tinn." + p[:-1].replace("/", ".")
                hit = module == package or module.startswith(package + ".")
            else:
                hit = module == "tinn." + p[:-3].replace("/", ".")
            if hit:
                found.append(i)
    return found


def climbing_imports(graph: dict, floors: list) -> list:
    """``(module, its floor, import, that floor)`` for every import of a module on a higher floor."""
    level = {m: floor_of(m, floors)[0] for m in graph}
    return sorted((m, floors[level[m]][0], d, floors[level[d]][0]) for m, deps in graph.items() for d in deps
                  if level[d] > level[m])


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


def test_every_module_is_on_exactly_one_floor_of_the_documented_table():
    floors = doc_floors()
    assert len(floors) >= 6 and [f for f, _ in floors[:2]] == ["runtime", "batch"] and floors[-1][0] == "top"
    misplaced = {m: [floors[i][0] for i in floor_of(m, floors)] for m in import_graph()}
    assert {m: f for m, f in misplaced.items() if len(f) != 1} == {}


def test_each_floor_imports_only_from_its_own_floor_or_below():
    assert climbing_imports(import_graph(), doc_floors()) == []


def test_an_import_that_climbs_a_floor_is_caught():
    """The check itself can fail: a runtime module importing a component is reported."""
    floors = [("runtime", ["runtime/"]), ("components", ["encodings/"])]
    graph = {"tinn.runtime.types": {"tinn.encodings.grid"}, "tinn.encodings.grid": {"tinn.runtime.types"}}
    assert climbing_imports(graph, floors) == [("tinn.runtime.types", "runtime", "tinn.encodings.grid", "components")]


def test_the_plumbing_lives_in_its_two_folders():
    """At most two private modules stay at the package's root: the rest of the plumbing is ``runtime/`` and
    ``batch/``, the two floors below everything else."""
    private = sorted(f for f in os.listdir(ROOT) if f.startswith("_") and f.endswith(".py") and f != "__init__.py")
    assert len(private) <= 2, private
    for package in ("runtime", "batch"):
        assert os.path.isfile(os.path.join(ROOT, package, "__init__.py"))


def test_no_module_is_longer_than_400_lines():
    lengths = {os.path.relpath(path, ROOT): sum(1 for _ in open(path, encoding="utf-8"))
               for path in module_paths()}
    assert {name: n for name, n in lengths.items() if n > 400} == {}


def test_the_registry_is_on_the_ground_floor():
    graph = import_graph()
    assert not reaches(graph, "tinn.registry", "tinn.object")
    assert not reaches(graph, "tinn.registry", "tinn.config")
    assert reaches(graph, "tinn.config", "tinn.trainer")
