"""
The code's layout, read from the source with `ast` (nothing is imported): the library under
autokernel/ has no import cycle and never imports a top-level script, and no file outside
kernels/ and tests/ outgrows one sitting. Imports inside functions count as much as those at the
top: a lazy import hides a cycle from Python, not from the next reader.

    uv run pytest tests/test_layout.py
"""
import ast

import autokernel

ROOT = autokernel.ROOT
PACKAGE = ROOT / "autokernel"
# The top-level scripts (kernel.py, the agent's file, included), and `reference`: the oracles
# live in the library now (autokernel/reference.py), so a bare `import reference` is a leftover.
SCRIPTS = {p.stem for p in ROOT.glob("*.py")} | {"reference"}
# autokernel/__init__.py loads the standard library's `profile` (with the repo root off
# sys.path), which the repo's profile.py would shadow: not the script.
STDLIB_SHADOWED = {("__init__", "profile")}
MAX_LINES = 700


def library_modules():
    """{module name under autokernel/: its file} (export_template/ is the exported package's
    source, not the library's)."""
    return {p.stem: p for p in sorted(PACKAGE.glob("*.py"))}


def package_names():
    """The names autokernel/__init__.py itself defines; any other name taken from the package
    (`autokernel.CUDA`, `from autokernel import KERNEL_TYPES`) is loaded from kernel_types."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def imported_names(source, submodules, own_names):
    """Every module a file's source imports, at any depth (functions included). A name taken
    from the package counts as its submodule, or as kernel_types (package_names)."""
    def from_package(name):
        if name in submodules:
            return f"autokernel.{name}"
        return "autokernel" if name in own_names else "autokernel.kernel_types"
    names, aliases = set(), set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.add(alias.name)
                if alias.name == "autokernel":
                    aliases.add(alias.asname or "autokernel")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            if node.module == "autokernel":
                names.update(from_package(a.name) for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases:
            names.add(from_package(node.attr))
    return names


def library_graph():
    """{module: the autokernel modules it imports} (the package itself is left out: it imports
    none of them, and loads them by name on first use)."""
    modules, own = library_modules(), package_names()
    graph = {}
    for name, path in modules.items():
        if name == "__init__":
            continue
        found = imported_names(path.read_text(), set(modules), own)
        graph[name] = sorted({n.split(".")[1] for n in found if n.startswith("autokernel.")}
                             - {name})
    return graph


def cycles(graph):
    """Import cycles (each as the modules around it, found by a depth-first walk: none found
    means there is none)."""
    found, done = [], set()

    def visit(node, path):
        for nxt in graph.get(node, []):
            if nxt in path:
                cycle = path[path.index(nxt):]
                turned = min(tuple(cycle[i:] + cycle[:i]) for i in range(len(cycle)))
                if turned not in found:
                    found.append(turned)
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    return found


def test_the_library_has_no_import_cycle():
    found = cycles(library_graph())
    assert not found, "import cycles inside autokernel/: " + "; ".join(
        " -> ".join(c + (c[0],)) for c in found)


def test_no_library_module_imports_a_top_level_script():
    modules, own = library_modules(), package_names()
    offenders = [f"autokernel/{path.name} imports {name}"
                 for stem, path in modules.items()
                 for name in sorted(imported_names(path.read_text(), set(modules), own))
                 if name.split(".")[0] in SCRIPTS and (stem, name) not in STDLIB_SHADOWED]
    assert not offenders, "; ".join(offenders)


def test_no_file_outside_kernels_and_tests_is_over_700_lines():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.split("/")[0] in ("kernels", "tests") or rel.startswith("."):
            continue
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            offenders.append(f"{rel} ({lines} lines)")
    assert not offenders, f"over {MAX_LINES} lines: {', '.join(offenders)}"


def test_imports_in_functions_and_through_the_package_count():
    source = ("import autokernel as ak\nfrom autokernel import git, CUDA\n\n"
              "def f():\n    from autokernel import timing\n    import bench\n"
              "    return ak.gate, ak.DEVICE, ak.ROOT\n")
    names = imported_names(source, {"git", "timing", "gate", "kernel_types"}, {"ROOT"})
    assert {"autokernel.git", "autokernel.timing", "autokernel.gate", "autokernel.kernel_types",
            "bench"} <= names


def test_a_planted_cycle_is_found():
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [("a", "b", "c")]
    assert cycles({"a": ["b", "c"], "b": ["c"], "c": []}) == []
