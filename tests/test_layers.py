"""The package's layout is its architecture: imports go down the layers, never up, never in a
circle. Read from the source with ``ast`` (nothing is imported), so a lazy import inside a
function counts like any other."""

from __future__ import annotations

import ast
from pathlib import Path

import gateway

PACKAGE = Path(gateway.__file__).parent

# Top to bottom: a module may import its own room and any room below it. Rooms on one line
# are peers and may not import each other (a peer import is an undeclared layer).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli", "app"),
    ("web",),
    ("inbound",),
    ("access", "security"),
    ("inbox",),
    ("dedup",),
    ("conversations",),
    ("knowledge",),
    ("pipeline", "notifications"),
    ("outbound", "push", "providers"),
    ("ratelimit", "leases"),
    ("api",),
    ("stores",),
    ("config", "keys", "metrics", "logging_setup"),
)
# The one client library: PushClient runs in other people's processes, so it may use the
# feed's wire format and nothing else of the server.
CLIENT_MODULES = {"gateway.push.client": {"gateway.push.protocol"}}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every gateway module ``name`` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # ``from gateway.x import y`` imports the module gateway.x.y when there is one.
            found.update(f"{base}.{alias.name}" for alias in node.names
                         if f"{base}.{alias.name}" in known)
    return {target for target in found if target in known and target != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(room: str) -> int:
    for index, rooms in enumerate(LAYERS):
        if room in rooms:
            return index
    raise AssertionError(f"gateway.{room} is in no layer of tests/test_layers.py")


def test_every_room_has_a_layer() -> None:
    rooms = {_room(name) for name in _modules()} - {""}
    for room in rooms:
        _layer(room)


def test_imports_only_go_down() -> None:
    upward = []
    for module, targets in _graph().items():
        if module == "gateway":
            continue
        own = _room(module)
        for target in targets:
            room = _room(target)
            if target == "gateway" or room == own:
                continue
            if _layer(room) <= _layer(own):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that go up or sideways:\n" + "\n".join(sorted(upward))


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_push_client_imports_nothing_server_side() -> None:
    graph = _graph()
    for client, allowed in CLIENT_MODULES.items():
        assert graph[client] <= allowed, f"{client} imports {sorted(graph[client] - allowed)}"


def test_the_check_sees_a_cycle_and_an_upward_import(tmp_path: Path) -> None:
    """The checks above would pass on an empty graph: show that they find what they guard."""
    (tmp_path / "a.py").write_text("def f():\n    from gateway.b import g\n")
    (tmp_path / "b.py").write_text("from . import a\n")
    known = {"gateway.a", "gateway.b"}
    assert _imports("gateway.a", tmp_path / "a.py", known) == {"gateway.b"}
    assert _imports("gateway.b", tmp_path / "b.py", known) == {"gateway.a"}
    assert _layer("stores") > _layer("web")
