"""No module of bnnsfw imports itself through other modules.

Every import counts, those inside functions included; only those under ``if TYPE_CHECKING:``
do not. The graph is the one lint-imports checks (grimp's), made of the imports as written.
Python runs a package's ``__init__`` before any module inside it, but that implicit import is
not an edge of the graph: ``bnnsfw/__init__.py`` imports nearly every module, so every module
would be on a cycle. A module that imports its own package explicitly, while the package's
``__init__`` imports it, is on one. lint-imports' ``acyclic_siblings`` contract
(pyproject.toml) sees cycles between the modules and subpackages of a package, not those
between a package's ``__init__`` and its own modules; this test sees both.
"""

import grimp


def _cycles(graph: grimp.ImportGraph) -> dict[frozenset[str], tuple[str, ...]]:
    """Each cycle of imports, as the modules it passes through from one module back to it."""
    cycles: dict[frozenset[str], tuple[str, ...]] = {}
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module, as_packages=False)
            if back is not None:
                cycle = (module, *back)
                cycles.setdefault(frozenset(cycle), cycle)
    return cycles


def _line(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    where = ", ".join(f"l.{detail['line_number']} {detail['line_contents']!r}" for detail in details)
    return f"  {importer} -> {imported} ({where})"


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("bnnsfw", exclude_type_checking_imports=True, cache_dir=None)
    cycles = _cycles(graph)
    report = [
        "\n".join([" -> ".join(cycle), *(_line(graph, a, b) for a, b in zip(cycle, cycle[1:]))])
        for cycle in cycles.values()
    ]
    assert not cycles, "import cycles:\n" + "\n".join(report)


def test_a_cycle_through_a_package_init_is_found():
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.sub", "pkg.sub.a", "pkg.b"):
        graph.add_module(module)
    graph.add_import(importer="pkg.sub", imported="pkg.sub.a")
    graph.add_import(importer="pkg.sub.a", imported="pkg.sub")
    graph.add_import(importer="pkg", imported="pkg.b")
    assert list(_cycles(graph).values()) == [("pkg.sub", "pkg.sub.a", "pkg.sub")]
