"""The import graph between deepdsl's top-level modules, as import-linter sees it (grimp, its graph builder).

    python scripts/import_graph.py                 # one line per module: what it imports
    python scripts/import_graph.py backends api    # and every import from the one to the other, with its line

Function-local imports count like module-level ones; `(deepdsl)` is the package's `__init__`. The rules these
edges must keep are the layers in pyproject.toml ([tool.importlinter]).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import grimp


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(deepdsl)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair", nargs="*", metavar="MODULE", help="two top-level modules: list the imports between them")
    args = ap.parse_args()
    if len(args.pair) not in (0, 2):
        ap.error("give two modules, or none")
    graph = grimp.build_graph("deepdsl", cache_dir=None)
    edges: dict[str, set[str]] = defaultdict(set)
    for m in graph.modules:
        for imported in graph.find_modules_directly_imported_by(m):
            if top(m) != top(imported):
                edges[top(m)].add(top(imported))
    for m in sorted(edges):
        print(f"{m:14} -> {', '.join(sorted(edges[m]))}")
    if args.pair:
        src, dst = args.pair
        for m in sorted(graph.modules):
            for imported in sorted(graph.find_modules_directly_imported_by(m)):
                if top(m) == src and top(imported) == dst:
                    lines = [d["line_number"] for d in graph.get_import_details(importer=m, imported=imported)]
                    print(f"  {m} -> {imported} (line {', '.join(map(str, lines))})")


if __name__ == "__main__":
    main()
