"""The project's import graph, read with ``ast`` (module-level and function-level imports alike).

Checks the rules of docs/dev/CONVENTIONS.md ("Layout and imports"): no import cycle among
fedica's modules, no leading-underscore name imported from another module, and the direction
rules between the library, the Flower side and its experiment harness. The repository's folders server/, clients/ and
scripts/ are read under the names they install as (fedica.server, fedica.clients, fedica.scripts).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Folder -> the package it installs as (pyproject.toml's package-dir).
ROOTS = {"fedica": "fedica", "server": "fedica.server", "clients": "fedica.clients", "scripts": "fedica.scripts"}
FLOWER_SIDE = ("fedica.server", "fedica.clients", "fedica.scripts", "fedica.conf")
LIBRARY_MAY_NOT_IMPORT = ("flwr", "hydra", "omegaconf", "ray", "fedica.server", "fedica.clients", "fedica.scripts")
# fedica's own ServerApp drives the harness; the rest of fedica.server is for anyone's Flower app.
HARNESS_SIDE = ("fedica.server.harness", "fedica.server.app")


@dataclass(frozen=True)
class Import:
    """One import: ``importer`` imports ``name`` from module ``target`` (``name`` None: the module itself)."""

    importer: str
    target: str
    name: str | None
    line: int


@dataclass
class Graph:
    """The project's modules (by dotted name), which of them are packages, and every import they make."""

    sources: dict[str, str]
    packages: set[str]

    def imports(self) -> list[Import]:
        return [imp for module, source in self.sources.items() for imp in self.imports_of(module, source)]

    def imports_of(self, module: str, source: str) -> list[Import]:
        """Every import statement of ``source`` at any depth, resolved to absolute names.

        ``from package import name`` imports the submodule ``package.name`` when the project has one.
        """
        anchor = module if module in self.packages else module.rpartition(".")[0]
        found = []
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                found += [Import(module, alias.name, None, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = anchor.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    found.append(Import(module, submodule, None, node.lineno) if submodule in self.sources
                                 else Import(module, base, alias.name, node.lineno))
        return found

    def edges(self) -> dict[str, set[str]]:
        """Importer -> the project modules it imports (by name, not the packages above them)."""
        edges: dict[str, set[str]] = {module: set() for module in self.sources}
        for imp in self.imports():
            if imp.target in self.sources and imp.target != imp.importer:
                edges[imp.importer].add(imp.target)
        return edges


def module_name(path: Path, root: Path, package: str) -> str:
    """The dotted name of ``path`` (a .py file under ``root``), ``root`` being installed as ``package``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def project_graph(repo: Path = REPO, roots: Mapping[str, str] = ROOTS) -> Graph:
    sources, packages = {}, set()
    for folder, package in roots.items():
        for path in sorted((repo / folder).rglob("*.py")):
            name = module_name(path, repo / folder, package)
            sources[name] = path.read_text()
            if path.name == "__init__.py":
                packages.add(name)
    return Graph(sources, packages)


def cycles(edges: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (or of one importing itself), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in sorted(edges.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = frozenset(stack[stack.index(node):])
            del stack[stack.index(node):]
            if len(component) > 1 or node in edges.get(node, ()):
                found.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def within(module: str, packages: Iterable[str]) -> bool:
    """Whether ``module`` is one of ``packages`` or inside one."""
    return any(module == p or module.startswith(p + ".") for p in packages)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(imports: Iterable[Import]) -> set[tuple[str, str, str]]:
    """(importer, module, name) of every leading-underscore name (or module) imported from another project module."""
    private = set()
    for imp in imports:
        if within(imp.target, ["fedica"]) and imp.target != imp.importer:
            names = [imp.name] if imp.name is not None else imp.target.split(".")
            private.update((imp.importer, imp.target, name) for name in names if is_private(name))
    return private


def direction_violations(imports: Iterable[Import]) -> list[str]:
    """The imports that break docs/dev/CONVENTIONS.md's direction rules, one readable line each."""
    broken = []
    for imp in imports:
        where = f"{imp.importer} (line {imp.line}) imports {imp.target}"
        if not within(imp.importer, FLOWER_SIDE) and within(imp.target, LIBRARY_MAY_NOT_IMPORT):
            broken.append(f"{where}: the library imports no Flower, Hydra, OmegaConf, Ray nor the Flower side")
        if within(imp.importer, ["fedica.server"]) and within(imp.target, ["fedica.clients", "fedica.scripts"]):
            broken.append(f"{where}: fedica.server never imports fedica.clients or fedica.scripts")
        if within(imp.target, ["fedica.scripts"]) and not within(imp.importer, ["fedica.scripts"]):
            broken.append(f"{where}: nothing but tests imports fedica.scripts")
        if (within(imp.importer, ["fedica.server"]) and not within(imp.importer, HARNESS_SIDE)
                and within(imp.target, ["fedica.server.harness"])):
            broken.append(f"{where}: the reusable Flower side never imports the harness")
    return broken


GRAPH = project_graph()


def test_the_graph_covers_every_folder_under_its_installed_name():
    modules = set(GRAPH.sources)
    assert {"fedica", "fedica.server.app", "fedica.server.harness.runner", "fedica.clients.app",
            "fedica.scripts.engines", "fedica.scripts.deploy.bind"} <= modules
    # Function-level imports count: baselines imports afcl inside run_baselines' helpers only.
    assert "fedica.evaluation.afcl" in GRAPH.edges()["fedica.evaluation.baselines"]
    assert "fedica.scripts.deploy" in GRAPH.edges()["fedica.scripts.engines"]


def test_no_import_cycle_among_fedicas_modules():
    found = cycles(GRAPH.edges())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(sorted(cycle)) for cycle in found)


def room(module: str) -> str:
    """The room of a library module: its subpackage (``fedica.fedgem``) or its top-level module (``fedica.privacy``)."""
    return ".".join(module.split(".")[:2])


def room_edges(edges: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The rooms of ``fedica/`` and the other rooms each imports (the package's own ``__init__`` left out: it is the
    public face that gathers the estimators, not a room)."""
    rooms: dict[str, set[str]] = {}
    for importer, targets in edges.items():
        if importer == "fedica" or not importer.startswith("fedica.") or within(importer, FLOWER_SIDE):
            continue
        rooms.setdefault(room(importer), set()).update(
            room(t) for t in targets if t != "fedica" and not within(t, FLOWER_SIDE) and room(t) != room(importer))
    return rooms


def test_no_two_rooms_of_the_library_import_each_other():
    # The library in layers: the bottom (parameters, sites, protocol, privacy accounting, persistence, metrics, ...),
    # the algorithms above it, the experiment rooms above those; no circle at any level (docs/dev/ARCHITECTURE.md).
    found = cycles(room_edges(GRAPH.edges()))
    assert not found, "rooms in a circle: " + "; ".join(" <-> ".join(sorted(cycle)) for cycle in found)
    rooms = room_edges(GRAPH.edges())
    for algorithm in ("fedica.fedgem", "fedica.rfica"):  # an algorithm imports no experiment room
        assert not rooms[algorithm] & {"fedica.data", "fedica.evaluation", "fedica.config", "fedica.attacks",
                                       "fedica.tasks", "fedica.results"}, algorithm


def test_the_room_check_finds_a_circle_of_rooms_that_no_module_cycle_shows():
    edges = {"fedica.a.x": {"fedica.b.y"}, "fedica.b.z": {"fedica.a.w"}, "fedica.a.w": set(), "fedica.b.y": set(),
             "fedica": {"fedica.a.x"}}
    assert cycles(edges) == []
    assert cycles(room_edges(edges)) == [frozenset({"fedica.a", "fedica.b"})]


def test_no_module_imports_a_private_name_of_another():
    found = private_imports(GRAPH.imports())
    assert not found, "private names imported across modules: " + ", ".join(
        f"{importer} imports {name} from {target}" for importer, target, name in sorted(found))


def test_imports_go_the_directions_the_conventions_say():
    broken = direction_violations(GRAPH.imports())
    assert not broken, "\n".join(broken)


def test_the_checks_find_a_cycle_a_private_import_and_a_wrong_direction_in_a_synthetic_graph():
    graph = Graph(sources={
        "fedica": "",
        "fedica.a": "from fedica.b import public\n",
        "fedica.b": "def f():\n    from fedica import c\n",  # function-level, through the package
        "fedica.c": "from .a import _helper\nimport flwr\n",
        "fedica.d": "from fedica.a import public\n",
        "fedica.server": "",
        "fedica.server.x": "from fedica.scripts import y\nfrom .harness import runner\n",
        "fedica.server.harness": "",
        "fedica.server.harness.runner": "",
        "fedica.scripts": "",
        "fedica.scripts.y": "",
    }, packages={"fedica", "fedica.server", "fedica.server.harness", "fedica.scripts"})
    imports = graph.imports()
    assert cycles(graph.edges()) == [frozenset({"fedica.a", "fedica.b", "fedica.c"})]
    assert private_imports(imports) == {("fedica.c", "fedica.a", "_helper")}
    assert direction_violations(imports) == [
        "fedica.c (line 2) imports flwr: the library imports no Flower, Hydra, OmegaConf, Ray nor the Flower side",
        "fedica.server.x (line 1) imports fedica.scripts.y: fedica.server never imports fedica.clients or fedica.scripts",
        "fedica.server.x (line 1) imports fedica.scripts.y: nothing but tests imports fedica.scripts",
        "fedica.server.x (line 2) imports fedica.server.harness.runner: the reusable Flower side never imports the harness",
    ]
    assert cycles({"fedica.a": {"fedica.a"}}) == [frozenset({"fedica.a"})]
    assert cycles({"fedica.a": {"fedica.b"}, "fedica.b": set()}) == []


def test_the_server_package_init_imports_no_module_of_its_own():
    # Under flwr run's simulation the ServerApp and the ClientApp (which imports fedica.server.records)
    # load in two threads at once; an __init__ importing the strategies deadlocked them (_DeadlockError).
    tree = ast.parse((REPO / "server" / "__init__.py").read_text())
    imported = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(node, ast.ImportFrom) and node.module == "importlib" for node in imported)
