"""ARCHITECTURE.md's layer table against the code: every module of journalfs/ is in exactly
one row, no import goes up a layer, no modules import each other in a circle (imports inside
functions and under TYPE_CHECKING count too), and an import inside a function says why in a
comment. The imports are read with ast, nothing is imported."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "journalfs"
DOC = REPO / "ARCHITECTURE.md"

#: Cycles known and being removed by their owners (#26 item 7): each entry is the set of
#: modules of one cycle. Delete an entry once its cycle is gone.
KNOWN_CYCLES = [
]


@dataclass(frozen=True)
class Import:
    source: str       # the importing module
    target: str       # the journalfs module (or other top-level name) imported
    line: int
    late: bool        # inside a function


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _layer_table() -> dict[str, int]:
    """{table entry ("journalfs/fs/" or "journalfs/cli.py"): layer} from ARCHITECTURE.md."""
    entries: dict[str, int] = {}
    for line in DOC.read_text().splitlines():
        row = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if row:
            for entry in re.findall(r"`([^`]+)`", row.group(2)):
                assert entry not in entries, f"{entry} is in two rows of the layer table"
                entries[entry] = int(row.group(1))
    assert entries, "ARCHITECTURE.md has no layer table (| layer | modules | ... |)"
    return entries


def _entry_of(module: str, entries: dict[str, int]) -> str | None:
    """The most specific table entry naming ``module`` (a file beats its directory)."""
    path = MODULES[module].relative_to(REPO).as_posix()
    if path in entries:
        return path
    folders = [e for e in entries if e.endswith("/") and path.startswith(e)]
    return max(folders, key=len) if folders else None


def _target(source: str, node: ast.ImportFrom | ast.Import, name: str) -> str:
    if isinstance(node, ast.Import):
        return name
    base = source.split(".")
    if MODULES[source].name != "__init__.py":
        base.pop()  # relative to the module's package
    if node.level:
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base) + (f".{node.module}" if node.module else "")
    else:
        target = node.module or ""
    return f"{target}.{name}" if f"{target}.{name}" in MODULES else target


def _imports() -> list[Import]:
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        late_nodes = {id(n) for f in ast.walk(tree)
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    target = _target(module, node, alias.name)
                    while target.startswith("journalfs") and target not in MODULES:
                        target = target.rsplit(".", 1)[0]
                    found.append(Import(module, target, node.lineno, id(node) in late_nodes))
    return found


IMPORTS = _imports()


def test_the_layer_table_names_every_module_once():
    entries = _layer_table()
    missing = sorted(m for m in MODULES if _entry_of(m, entries) is None)
    assert not missing, f"modules ARCHITECTURE.md's layer table does not name: {missing}"
    for entry in entries:  # and nothing that is not there
        assert (REPO / entry).exists(), f"the layer table names {entry}, which does not exist"


def test_no_import_goes_up_a_layer():
    entries = _layer_table()
    layer = {m: entries[_entry_of(m, entries)] for m in MODULES}
    upward = sorted({f"{i.source} (layer {layer[i.source]}) imports {i.target} "
                     f"(layer {layer[i.target]}), line {i.line}"
                     for i in IMPORTS if i.target in layer and layer[i.target] > layer[i.source]})
    assert not upward, "\n".join(upward)


def _cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_modules_import_each_other_in_a_circle():
    edges: dict[str, set[str]] = {}
    for i in IMPORTS:
        if i.target in MODULES and i.target != i.source:
            edges.setdefault(i.source, set()).add(i.target)
    cycles = [c for c in _cycles(edges) if c not in KNOWN_CYCLES]
    assert not cycles, f"import cycles: {[sorted(c) for c in cycles]}"


def _commented(lines: list[str], line: int) -> bool:
    """A comment on the import's own line, or on the line above the run of import lines it
    is part of (one comment may say why for a group; blank lines may part the group)."""
    if "#" in lines[line - 1]:
        return True
    above = line - 2
    while above >= 0 and (re.match(r"\s*(from\s+\S+\s+)?import\s", lines[above]) or
                          not lines[above].strip()) and "#" not in lines[above]:
        above -= 1
    return above >= 0 and (lines[above].lstrip().startswith("#") or
                           (re.match(r"\s*(from\s+\S+\s+)?import\s", lines[above]) is not None
                            and "#" in lines[above]))


def test_an_import_inside_a_function_says_why():
    unexplained = []
    for i in IMPORTS:
        if not i.late:
            continue
        lines = MODULES[i.source].read_text().splitlines()
        if not _commented(lines, i.line):
            unexplained.append(f"{MODULES[i.source].relative_to(REPO)}:{i.line} imports {i.target}")
    assert not unexplained, ("imports inside functions without a comment saying why (start-up "
                             "or an optional dependency):\n" + "\n".join(sorted(set(unexplained))))


def test_the_bottom_layer_imports_nothing_of_journalfs():
    entries = _layer_table()
    bottom = [m for m in MODULES if entries[_entry_of(m, entries)] == 0]
    assert "journalfs.options" in bottom
    inward = sorted(f"{i.source} imports {i.target}" for i in IMPORTS
                    if i.source in bottom and i.target.startswith("journalfs"))
    assert not inward, inward


def test_the_command_lines_reach_commands_only_through_parsing():
    """cmdline/ (every --help loads it) imports no command's implementation."""
    reached = sorted(f"{i.source} imports {i.target}" for i in IMPORTS
                     if i.source.startswith("journalfs.cmdline")
                     and i.target.startswith("journalfs.commands")
                     and i.target not in ("journalfs.commands", "journalfs.commands.parsing"))
    assert not reached, reached
