"""The shape of the package (docs/architecture.md "Package map", issue 11).

A cycle between two modules means neither can be read, tested or moved
alone; the pure layers must not reach a Kafka client.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import processor

# the imported package (the installed wheel's sources in the compiled run)
PACKAGE = Path(str(processor.__file__)).resolve().parent

#: Cycles known and not yet broken; the test fails on any other.
KNOWN_CYCLES: list[set[str]] = []


def _module_graph() -> dict[str, set[str]]:
    modules: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        # every import counts, also under TYPE_CHECKING and inside functions
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_besides_the_known_ones() -> None:
    cycles = _cycles(_module_graph())
    assert [c for c in cycles if c not in KNOWN_CYCLES] == []


def test_the_two_cycles_named_in_issue_11_are_broken() -> None:
    graph = _module_graph()
    assert "processor.agent.request" not in graph["processor.agent.adapters"]
    assert (
        "processor.core.message_projections" not in graph["processor.core.image_offload"]
        or "processor.core.image_offload" not in graph["processor.core.message_projections"]
    )


def test_the_engine_and_the_core_load_no_kafka_client() -> None:
    code = (
        "import sys, processor.engine, processor.core.defaults; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'confluent_kafka'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    )
    assert out.stdout.strip() == "[]"
    graph = _module_graph()
    for name, deps in graph.items():
        if name.startswith("processor.core"):
            assert {d for d in deps if not d.startswith("processor.core")} == set(), name
        if name.startswith("processor.engine"):
            # the wire names (protocol), the record types (codec) and the settings
            outside = {d for d in deps if not d.startswith(("processor.core", "processor.engine"))}
            assert outside <= {
                "processor.protocol",
                "processor.codec",
                "processor.config",
            }, name


#: Layers in the order a record travels (docs/architecture.md): a module may import its
#: own layer and those before it, never a later one.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "processor.core",
        "processor.protocol",
        "processor.gcpolicy",
        "processor.kafka_dist",
        "processor.children",
    ),
    ("processor.agent", "processor.codec", "processor.config", "processor.files"),
    ("processor.engine", "processor.offline", "processor.workload"),
    # the Kafka adapter and the process's report (metrics, health) it feeds
    ("processor.kafka", "processor.telemetry"),
    ("processor.testing",),
    # one group member, and what is not a member (writer, readers, replay, shipper)
    (
        "processor.service",
        "processor.client",
        "processor.ship",
        "processor.devbroker",
        "processor.devcluster",
    ),
    ("processor.inspect",),
    ("processor.cli", "processor.__main__", "processor.examples"),
)


def _layer(module: str) -> int | None:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def test_every_module_has_a_layer() -> None:
    """A new package is placed in LAYERS, so its imports are checked too."""
    unplaced = [m for m in _module_graph() if m != "processor" and _layer(m) is None]
    assert unplaced == []


def test_imports_point_one_way_from_core_to_cli() -> None:
    backwards = []
    for name, deps in _module_graph().items():
        rank = _layer(name)
        for dep in deps:
            dep_rank = _layer(dep)
            if rank is not None and dep_rank is not None and dep_rank > rank:
                backwards.append(f"{name} -> {dep}")
    assert backwards == []
