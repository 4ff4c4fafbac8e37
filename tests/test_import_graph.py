"""The import graph of our three packages, read from the source with `ast` (imports inside functions included):
no cycle, and the layering docs/layout.md describes.

- encodings/ imports nothing of ours; workers/ imports encodings/ only; search/ may import both.
- Within search/: cli -> reports -> export, cost, job -> run -> optimizers -> config (an arrow: "may import"; a
  package may also import every package further along the chain, never one before it).
- No optimizer's name is compared outside search/optimizers/ (what differs is the class's capability flags).
- An import inside a function is read as an import: one that dodges a cycle is a cycle here. What may stay inside
  a function (torch, Ray, transformers or matplotlib kept out of the light commands) says why in a comment.

No module is imported to build the graph, so a cycle fails this test before it can fail an import.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

# the tree checked: the repository's, or a copy of the three folders (the new-optimizer test points this at one
# with a module added, to show that the rules hold as they are)
ROOT = Path(os.environ.get("LONGROPE_SOURCE_ROOT") or Path(__file__).resolve().parents[1])
FOLDERS = {"encodings": "longrope.encodings", "search": "longrope.search", "workers": "longrope.workers"}
# search/'s sub-packages, each allowed to import those of a lower rank (and itself)
SEARCH_RANKS = {
    "config": 0,
    "downloads": 0,
    "optimizers": 1,
    "run": 2,
    "job": 3,
    "cost": 3,
    "export": 3,
    "reports": 4,
    "cli": 5,
}


def module_files(root: Path = ROOT, folders: dict[str, str] = FOLDERS) -> dict[str, Path]:
    """{dotted module name: file} for every .py file under the code folders (a package is its __init__)."""
    modules = {}
    for folder, package in folders.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            name = ".".join([package, *parts]).removesuffix(".__init__")
            modules[name] = path
    return modules


def imported_names(path: Path, name: str) -> list[tuple[str, ast.stmt]]:
    """Every module name an import statement in the file names (relative imports resolved), with the statement:
    `from P import x` names P.x and P (P.x is kept only if it is a module, by the caller)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found += [(f"{base}.{alias.name}", node) for alias in node.names]
            found.append((base, node))
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the modules of ours it imports}. `from P import x` is an edge to P.x when that is a module of ours,
    else to P; importing a package's submodule is an edge to the submodule only (package __init__ files import
    nothing, which `test_package_inits_import_nothing` checks)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        names = imported_names(path, name)
        for target, node in names:
            if target not in modules or target == name:
                continue
            submodule = isinstance(node, ast.ImportFrom) and any(
                f"{target}.{alias.name}" in modules for alias in node.names
            )
            if not (submodule and modules[target].name == "__init__.py"):
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path) per strongly connected component of more than one module, or a self-loop
    (Tarjan 1972, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(closed_path(graph, set(component)))
    return found


def closed_path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A cycle through the component's first module, found by breadth-first search inside the component."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, node, start]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    return [start, start]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(module_files())


def test_the_graph_sees_the_modules_and_their_imports(graph):
    """The walk finds every package and follows imports inside functions too: the CLI entry point imports the
    search commands at the top, and `search` imports the run's job code only inside its handler."""
    assert {"longrope.search.cli.main", "longrope.encodings.rotary", "longrope.workers.pool"} <= set(graph)
    assert "longrope.search.cli.search_commands" in graph["longrope.search.cli.main"]
    assert "longrope.search.job.jobs" in graph["longrope.search.cli.search_commands"]  # inside a function
    assert len(graph) > 100


def test_no_import_cycle(graph):
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_encodings_import_nothing_of_ours_and_workers_never_import_search(graph):
    encodings = {(a, b) for a, targets in graph.items() for b in targets if a.startswith("longrope.encodings")}
    assert all(b.startswith("longrope.encodings") for _, b in encodings), sorted(encodings)
    upward = sorted((a, b) for a, targets in graph.items() for b in targets if a.startswith("longrope.workers"))
    assert not [edge for edge in upward if edge[1].startswith("longrope.search")], upward


def test_search_packages_import_in_one_direction(graph):
    """cli -> reports -> export, cost, job -> run -> optimizers -> config; never back up the chain."""
    wrong = []
    for source, targets in graph.items():
        for target in targets:
            ranks = [
                SEARCH_RANKS.get(name.split(".")[2]) if name.count(".") >= 3 else None for name in (source, target)
            ]
            if not name_in_search(source) or not name_in_search(target) or None in ranks:
                continue
            same_package = source.split(".")[2] == target.split(".")[2]
            if not same_package and ranks[1] >= ranks[0]:
                wrong.append(f"{source} -> {target}")
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))
    packages = {name.split(".")[2] for name in graph if name_in_search(name) and name.count(".") >= 3}
    assert packages == set(SEARCH_RANKS), "a new search/ sub-package needs its place in SEARCH_RANKS"


def name_in_search(name: str) -> bool:
    return name.startswith("longrope.search.")


def search_rank(name: str) -> int | None:
    """The rank of the search/ sub-package a module is in (None: not in one)."""
    return SEARCH_RANKS.get(name.split(".")[2]) if name_in_search(name) and name.count(".") >= 3 else None


# the optimizers' names (search.optimizer's registered choices); only search/optimizers/ compares them
OPTIMIZER_NAMES = {"dim_mono", "cmaes", "gradient", "hybrid"}
NAME_OWNERS = ("search/optimizers/",)


def string_constants(node: ast.AST) -> set[str]:
    """The strings a comparison operand spells out: a literal, or a tuple, list or set of literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(string_constants(item) for item in node.elts))
    return set()


def optimizer_name_comparisons(root: Path = ROOT) -> list[str]:
    """`path:line` of every comparison (==, !=, in, match case) with an optimizer's name, outside its owners."""
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            if where.startswith(NAME_OWNERS):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
                operands += [node.value] if isinstance(node, ast.MatchValue) else []
                if set().union(*map(string_constants, operands)) & OPTIMIZER_NAMES:
                    found.append(f"{where}:{node.lineno}")
    return found


def test_no_optimizer_name_is_compared_outside_the_optimizers(tmp_path):
    """What differs between optimizers is asked of the optimizer (its capability flags: `descends`,
    `supports_racing`), never decided again by comparing its name; a planted comparison and a `match` case are
    found."""
    assert not optimizer_name_comparisons(), optimizer_name_comparisons()
    planted = tmp_path / "search" / "run"
    planted.mkdir(parents=True)
    (planted / "a.py").write_text('x = kind in ("gradient", "hybrid")\nmatch kind:\n    case "cmaes":\n        pass\n')
    (tmp_path / "search" / "optimizers").mkdir()
    (tmp_path / "search" / "optimizers" / "b.py").write_text('y = kind == "cmaes"\n')
    for folder in ("encodings", "workers"):
        (tmp_path / folder).mkdir()
    assert optimizer_name_comparisons(tmp_path) == ["search/run/a.py:1", "search/run/a.py:3"]


MAX_LINES = 450


def test_no_module_of_ours_over_max_lines():
    """Small modules named for what they hold: a module of ours past MAX_LINES is split, not grown (the package,
    the tests and the benchmarks alike)."""
    folders = ("search", "encodings", "workers", "tests", "bench")
    files = [path for folder in folders for path in (ROOT / folder).rglob("*.py")]
    assert len(files) > 100, "the walk found the modules"
    long = {path.relative_to(ROOT): len(path.read_text().splitlines()) for path in files}
    assert not {path: n for path, n in long.items() if n > MAX_LINES}


def test_search_package_inits_import_nothing():
    """search/'s package __init__ files hold a docstring only, so importing a submodule never runs other modules
    first (and the graph above needs no edge from a submodule to its package)."""
    for name, path in module_files().items():
        if path.name == "__init__.py" and name.startswith("longrope.search"):
            imports = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
            assert not imports, f"{path} imports: keep package __init__ files to a docstring"


def test_every_import_inside_a_function_says_why():
    """A lazy import keeps torch, Ray, transformers or matplotlib out of the commands that need none of them; each
    run of consecutive imports inside a function of the package carries a comment saying so."""
    silent = []
    for path in module_files().values():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            imports = [n for n in ast.walk(function) if isinstance(n, ast.Import | ast.ImportFrom)]
            for group in consecutive(sorted(imports, key=lambda n: n.lineno)):
                text = lines[group[0].lineno - 1 : group[-1].end_lineno]
                if not any("#" in line for line in text):
                    silent.append(f"{path.relative_to(ROOT)}:{group[0].lineno}: {text[0].strip()}")
    assert not silent, "imports inside functions without a comment saying why:\n" + "\n".join(sorted(set(silent)))


def consecutive(nodes: list[ast.stmt]) -> list[list[ast.stmt]]:
    """Import statements split into runs: a run ends where a line that is not one of them comes between."""
    runs: list[list[ast.stmt]] = []
    for node in nodes:
        if runs and node.lineno <= runs[-1][-1].end_lineno + 2:  # one blank line (isort's sections) may part them
            runs[-1].append(node)
        else:
            runs.append([node])
    return runs


# ---- the checks above can fail: a made-up tree with a cycle dodged inside a function ----


def test_a_cycle_dodged_inside_a_function_is_found(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text('"""a package"""\n')
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text('"""a sub-package"""\n')
    (tmp_path / "pkg" / "a.py").write_text("from longrope.x.sub import b\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("def f():\n    from ..a import g  # dodges the cycle\n")
    (tmp_path / "pkg" / "c.py").write_text("import longrope.x.a\n")
    modules = module_files(tmp_path, {"pkg": "longrope.x"})
    graph = import_graph(modules)
    assert graph["longrope.x.a"] == {"longrope.x.sub.b"} and graph["longrope.x.sub.b"] == {"longrope.x.a"}
    assert cycles(graph) == [["longrope.x.a", "longrope.x.sub.b", "longrope.x.a"]]
    (tmp_path / "pkg" / "sub" / "b.py").write_text("def f():\n    return 1\n")
    assert cycles(import_graph(module_files(tmp_path, {"pkg": "longrope.x"}))) == []
