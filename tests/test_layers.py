"""The import graph follows the layers of docs/architecture.md ("Layers"): no cycle, no arrow up.

Every ``import`` and ``from ... import`` in ``dressage/`` and ``workers/`` counts, the lazy ones
inside functions included (a lazy import is still a dependency; it only changes when it is paid).
``if TYPE_CHECKING:`` imports count for the layers (a type that names a higher layer is an arrow up
all the same) but not for cycles between modules (they never run, so they cannot make an import
cycle; two modules of one package may name each other's types).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS: list[tuple[str, ...]] = [
    # 0. foundation: what everything may use
    (
        "dressage",
        "dressage.errors",
        "dressage.config",
        "dressage.redact",
        "dressage.cleanup",
        "dressage.commandline",
        "dressage.interrupts",
        "dressage.tls",
    ),
    # 1. the log, and tokens in / tokens out
    ("dressage.store", "dressage.tito"),
    # 2. inference engines (protocol, client, dev engine)
    ("dressage.engines",),
    # 3. the proxy, sandboxes and agents
    ("dressage.proxy", "dressage.paddock", "dressage.agents"),
    # 4. rollout (runs, datasets, rewards, task kinds) and training
    ("dressage.rollout", "dressage.training"),
    # 5. task-kind plugins: they implement rollout's TaskKind seam, rollout never imports them
    ("dressage.harbor",),
    # 6. what composes rollout and training (exports: a run's log and its training samples as files)
    ("dressage.loop", "dressage.cluster", "dressage.integrations", "dressage.view", "dressage.exports"),
    # 7. processes and the command line
    ("dressage.cli", "workers"),
]

CYCLES_BEING_REMOVED: list[frozenset[str]] = []
"""Cycles another refactor in flight is breaking (empty: the store and proxy refactors have landed)."""


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in ("dressage", "workers"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _nodes(tree: ast.AST, runtime_only: bool) -> list[ast.AST]:
    """Every node of ``tree``; with ``runtime_only``, none under ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if runtime_only and isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _imports(name: str, path: Path, modules: dict[str, Path], runtime_only: bool = False) -> set[str]:
    """The modules of ours that ``name`` imports (a ``from pkg import sub`` names the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _nodes(ast.parse(path.read_text(encoding="utf-8")), runtime_only):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [
                f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a package path
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph(runtime_only: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules, runtime_only) for name, path in modules.items()}


def _layer_of(module: str) -> tuple[int, str]:
    """The layer index and the unit (package or foundation module) ``module`` belongs to."""
    best: tuple[int, str] | None = None
    for i, units in enumerate(LAYERS):
        for unit in units:
            if (module == unit or module.startswith(unit + ".")) and (
                best is None or len(unit) > len(best[1])
            ):
                best = (i, unit)
    assert best is not None, f"{module} is in no layer: add it to LAYERS and to docs/architecture.md"
    return best


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.add(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def test_every_module_has_a_layer() -> None:
    for module in _graph():
        _layer_of(module)


def test_no_arrow_from_a_lower_layer_to_a_higher_one() -> None:
    up = [
        f"{a} (layer {_layer_of(a)[0]}) imports {b} (layer {_layer_of(b)[0]})"
        for a, targets in _graph().items()
        for b in sorted(targets)
        if _layer_of(a)[0] < _layer_of(b)[0]
    ]
    assert not up, "arrows up the layers:\n" + "\n".join(up)


def test_no_import_cycle_between_modules() -> None:
    cycles = [c for c in _cycles(_graph(runtime_only=True)) if c not in CYCLES_BEING_REMOVED]
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def test_no_import_cycle_between_packages() -> None:
    """Collapsed to units (subpackages of ``dressage``, ``workers``, foundation modules), the graph is
    acyclic too: two packages of one layer may import each other's modules only one way."""
    units: dict[str, set[str]] = defaultdict(set)
    for a, targets in _graph().items():
        for b in targets:
            ua, ub = _layer_of(a)[1], _layer_of(b)[1]
            if ua != ub:
                units[ua].add(ub)
            units.setdefault(ub, set())
    cycles = _cycles(dict(units))
    assert not cycles, "package cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def test_the_allowance_names_only_cycles_that_still_exist() -> None:
    """An entry of :data:`CYCLES_BEING_REMOVED` whose cycle is gone must be removed with it."""
    live = set(_cycles(_graph(runtime_only=True)))
    stale = [sorted(c) for c in CYCLES_BEING_REMOVED if c not in live]
    assert not stale, f"remove these from CYCLES_BEING_REMOVED, their cycles are gone: {stale}"
