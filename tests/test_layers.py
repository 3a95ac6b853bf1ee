"""The package's layers import only downward, and no modules import one another in a circle.

Every import counts: at module level, inside functions and under ``TYPE_CHECKING`` (a type is
a dependency too). The layers, lowest first, are the subpackages (and the few modules at the top
of ``asyncflow/``) that the data passes through: the foundation the hot path may use, the hot
path, the model the collector owns, the documents, their renderers, the endpoint, and the
front door with the profiler's lifecycle and the CLI.
"""

from __future__ import annotations

import ast
from pathlib import Path

import asyncflow

_ROOT = Path(asyncflow.__file__).parent

#: the modules at the top of ``asyncflow/`` that every layer may use (leaves or near-leaves:
#: the version, errors, the clock, fork-safe locks, histograms, the options and the schema)
FOUNDATION = frozenset(
    {
        "asyncflow._version",
        "asyncflow.errors",
        "asyncflow.clock",
        "asyncflow._forksafe",
        "asyncflow.stats",
        "asyncflow.filtering",
        "asyncflow.config",
        "asyncflow.schema",
    }
)
#: the modules at the top that sit above every layer: the front door, ``python -m asyncflow``,
#: the profiler's lifecycle and the command line
FRONT = frozenset(
    {
        "asyncflow",
        "asyncflow.__main__",
        "asyncflow.profiler",
        "asyncflow.cli",
        "asyncflow._children",
        "asyncflow._armed",
        "asyncflow._startup",
    }
)
#: the subpackages, lowest first: each may import its own layer, the ones before it and the
#: foundation, never one after it (nor the front)
LAYERS = ("instrumentation", "model", "views", "render", "serve")
#: at most this many modules at the top of ``asyncflow/`` (the rest live in the layers)
MAX_TOP = 15


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in _ROOT.rglob("*.py"):
        parts = list(path.relative_to(_ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The package's modules that ``name`` imports (anywhere in it), each with a line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in known else base, node.lineno)
    return found


def _rank(module: str) -> int | None:
    """The layer's place, lowest first: 0 the foundation, 1.. the subpackages, last the
    front; None for a module in no layer."""
    if module in FOUNDATION:
        return 0
    if module in FRONT:
        return len(LAYERS) + 1
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in LAYERS:
        return LAYERS.index(parts[1]) + 1
    return None


def _graph() -> dict[str, dict[str, int]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_is_in_a_layer() -> None:
    assert sorted(m for m in _modules() if _rank(m) is None) == []


def test_no_module_imports_a_higher_layer() -> None:
    upward = []
    for name, targets in sorted(_graph().items()):
        mine = _rank(name)
        for target, line in sorted(targets.items()):
            theirs = _rank(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{name}:{line} imports {target}")
    assert upward == []


def test_no_import_circle() -> None:
    assert _circles(_graph()) == []


#: all that the renderers and the endpoint may take from the hot path: ``_session``, whose
#: ``internal_error`` counts a failure where it happens. Everything else they read from the
#: documents or from the model's read model (``asyncflow.model.read``): no registry, no record,
#: no log tuple, no probe.
HOT_PATH_ABOVE_THE_VIEWS = frozenset({"asyncflow.instrumentation._session"})


def _hot_path_reads(graph: dict[str, dict[str, int]]) -> list[str]:
    """The imports of the hot path by render/ and serve/ beyond ``HOT_PATH_ABOVE_THE_VIEWS``."""
    found = []
    for name, targets in sorted(graph.items()):
        if name.split(".")[1:2] not in (["render"], ["serve"]):
            continue
        for target, line in sorted(targets.items()):
            hot = target == "asyncflow.instrumentation" or target.startswith(
                "asyncflow.instrumentation."
            )
            if hot and target not in HOT_PATH_ABOVE_THE_VIEWS:
                found.append(f"{name}:{line} imports {target}")
    return found


def test_renderers_and_the_endpoint_read_the_model_not_the_hot_path() -> None:
    assert _hot_path_reads(_graph()) == []


def test_a_renderer_reading_the_hot_path_is_caught() -> None:
    graph = {
        "asyncflow.render.trace": {
            "asyncflow.instrumentation._session": 3,
            "asyncflow.instrumentation.channels": 4,
        },
        "asyncflow.serve.server": {"asyncflow.instrumentation": 9},
        "asyncflow.views.documents": {"asyncflow.instrumentation.futures": 5},
        "asyncflow.model.read": {"asyncflow.instrumentation.loops": 6},
    }
    assert _hot_path_reads(graph) == [
        "asyncflow.render.trace:4 imports asyncflow.instrumentation.channels",
        "asyncflow.serve.server:9 imports asyncflow.instrumentation",
    ]


def test_few_modules_at_the_top() -> None:
    top = sorted(p.name for p in _ROOT.glob("*.py"))
    assert len(top) <= MAX_TOP, top


def test_each_layer_says_what_it_may_import() -> None:
    for layer in LAYERS:
        doc = ast.get_docstring(ast.parse((_ROOT / layer / "__init__.py").read_text("utf-8")))
        assert doc, layer


#: the heavy third-party packages, and the only modules that may import them (at the edges, so
#: that ``import asyncflow`` and the hot path never load them): aiohttp for the endpoint's HTTP
#: side and the ``top`` client, textual for ``top``, the OTel SDK for its exporter
HEAVY = {
    "aiohttp": {"asyncflow.serve._http", "asyncflow.render.top"},
    "textual": {"asyncflow.render.top", "asyncflow.render.replay"},
    "opentelemetry": {"asyncflow.render.otel"},
}


def test_heavy_packages_are_imported_only_at_the_edges() -> None:
    found: dict[str, set[str]] = {package: set() for package in HEAVY}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            for target in targets:
                top = target.partition(".")[0]
                if top in found:
                    found[top].add(name)
    assert {package: found[package] - allowed for package, allowed in HEAVY.items()} == {
        package: set() for package in HEAVY
    }
