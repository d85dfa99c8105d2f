"""The house's floors hold: docs/architecture.md's table of layers says which floor every module
of npformer is on; the import graph, built from the source with ``ast``, may not run back up a
floor at the top of a module, reaches up from inside a function only where ``CALLS_UP`` says
why, and has no cycle (imports inside functions included)."""
import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "npformer"
DOC = ROOT / "docs" / "architecture.md"
# imports inside a function that reach up a floor, each with its reason
CALLS_UP = {
    ("npformer.nn.gpt", "npformer.hf"): "GPT.from_pretrained calls the one loader",
}


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules():
    """{module name: path} of every Python file of the package."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def floors(known):
    """{module: floor} read from docs/architecture.md's table (a row per "N. name", its
    backticked paths; the longest path holding a module decides)."""
    places = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        row = re.match(r"\| (\d+)\. [^|]+\| ([^|]+) \|", line)
        if row:
            for place in re.findall(r"`(npformer/[^`]*)`", row.group(2)):
                places[place] = int(row.group(1))
    out = {}
    for name, path in known.items():
        rel = path.relative_to(ROOT).as_posix()
        found = [p for p in places if rel == p or (p.endswith("/") and rel.startswith(p))]
        if found:
            out[name] = places[max(found, key=len)]
    return out


def imports(name, path, known):
    """[(imported module, inside a function)] of npformer's modules that ``name`` imports (a
    name imported from a package counts as the module it names, where it is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def target(node):
        if node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            return ".".join(base + ([node.module] if node.module else []))
        return node.module

    def visit(nodes, inside):
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                base = target(node)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.append((full if full in known else base, inside))
            elif isinstance(node, ast.Import):
                found.extend((alias.name, inside) for alias in node.names)
            inner = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(ast.iter_child_nodes(node), inner)

    visit(ast.parse(path.read_text(encoding="utf-8")).body, False)
    return [(m, inside) for m, inside in found if m in known and m != name]


@functools.lru_cache(maxsize=None)
def graph():
    known = modules()
    return known, floors(known), {name: imports(name, path, known)
                                  for name, path in known.items()}


def test_every_module_has_a_floor():
    known, floor, _ = graph()
    assert sorted(set(known) - set(floor)) == []


def test_no_import_runs_back_up_a_floor():
    _, floor, edges = graph()
    up = [f"{a} (floor {floor[a]}) imports {b} (floor {floor[b]})"
          + (" inside a function" if inside else "")
          for a, found in edges.items() for b, inside in found
          if floor[b] > floor[a] and not (inside and (a, b) in CALLS_UP)]
    assert up == []
    listed = {(a, b) for a, found in edges.items() for b, inside in found if inside}
    assert set(CALLS_UP) <= listed, "CALLS_UP names an import that is not there any more"


def test_there_is_no_import_cycle():
    _, _, edges = graph()
    graph_ = {a: sorted({b for b, _ in found}) for a, found in edges.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def connect(v):                                # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph_[v]:
            if w not in index:
                connect(w)
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
                cycles.append(sorted(component))

    for v in graph_:
        if v not in index:
            connect(v)
    assert cycles == []


def test_the_checks_see_an_arrow_up_and_a_cycle(tmp_path):
    """The graph reader finds what the tests above refuse: an import inside a function, a name
    imported from a package as its module, and relative imports."""
    known = {"npformer.a": tmp_path / "a.py", "npformer.b": tmp_path / "b.py",
             "npformer.pkg": tmp_path / "pkg" / "__init__.py",
             "npformer.pkg.c": tmp_path / "pkg" / "c.py"}
    (tmp_path / "pkg").mkdir()
    known["npformer.a"].write_text("from . import b\nfrom .pkg import c\n")
    known["npformer.pkg.c"].write_text("def f():\n    from ..a import x\n")
    assert imports("npformer.a", known["npformer.a"], known) == [("npformer.b", False),
                                                                  ("npformer.pkg.c", False)]
    assert imports("npformer.pkg.c", known["npformer.pkg.c"], known) == [("npformer.a", True)]
