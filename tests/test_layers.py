"""The import layering of collabrl (issue 23): no package imports from a layer above its
own, nor from another package of its own layer, and no two modules import each other.

Every module is parsed, not imported. An import counts wherever it is written: at the
top, inside a function (it runs on the first call all the same), and under `if
TYPE_CHECKING:` too (issue 34): a type-only import never runs, but it is still a
dependency a reader must follow, and two modules that name each other's types are one
idea split in two. Imports by string (`importlib.import_module`, as cli/options.py loads
config classes, or entry points) are not seen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "collabrl"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# Bottom to top. A package is the first name under collabrl: a subpackage (`engines`) or a
# top-level module (`config`); "__init__" is collabrl itself, "__main__" `python -m collabrl`.
# A package may import itself and the layers below its own, nothing else.
LAYERS: list[tuple[str, ...]] = [
    # The version, and UserError with `require`: they import nothing of collabrl.
    ("__init__", "errors"),
    # Secrets out of what is written for people to read; it imports nothing of collabrl.
    ("redact",),
    # Reading the files a user names, bounded, its errors UserErrors.
    ("userfiles",),
    # `auto` device and dtype against this machine; its checks raise through `require`.
    ("devices",),
    # Typed config dataclasses and their layering; EngineConfig.check checks devices.
    ("config",),
    # The base floor, one idea each: model references, the Episode record, rSIM's
    # strategy set with its keyword counting.
    ("models", "episode", "strategies"),
    # Run folders: their config, header and records, read back as Episodes.
    ("runs",),
    # Generation behind one Engine interface; answer checking and rewards. Neither
    # knows the other.
    ("engines", "rewards"),
    # The benchmark registry and prompts; the tools a policy calls. Both sit on engines.
    ("data", "tools"),
    # Who writes next: protocols turn engines, tools, data and rewards into Episodes.
    ("protocols",),
    # Protocols run over benchmarks and scored: run_eval, metrics, reports, routers. Beside
    # it, the one import surface of a protocol plugin, re-exporting the protocol layer, and
    # `collab doctor`'s checks of this machine (libraries, GPUs, sandbox, caches, disk).
    ("eval", "plugin", "doctor"),
    # The long jobs on top of evaluation: builders, evolve, the trainers, the server.
    ("builders", "evolve", "train", "serve"),
    # The two front doors: the Typer commands (options in, one library call, a result
    # out) and the Python API (`collabrl.evaluate`, `collabrl.train`).
    ("api", "cli"),
    # `python -m collabrl` runs the CLI.
    ("__main__",),
]

# Imports allowed between two packages of one layer, as (importer, imported), each with
# the reason it is allowed. None is needed now; add one only with its comment.
SAME_LAYER_EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()

# Module import cycles that are known and being removed, each as its set of modules.
# None is left; add one only with the issue that removes it.
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


@dataclass(frozen=True)
class Import:
    """One import of a collabrl module, where it is written."""

    importer: str  # the importing module, dotted
    imported: str  # the imported module, dotted (a package's __init__ by the package name)
    line: int

    def __str__(self) -> str:
        path = module_path(self.importer).relative_to(ROOT.parent)
        return f"{path}:{self.line} imports {self.imported}"


def module_path(module: str) -> Path:
    """The source file of a dotted collabrl module name."""
    path = ROOT.parent.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def module_names() -> dict[str, Path]:
    """Every module of collabrl by its dotted name (a package by its own name)."""
    names = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def package_of(module: str) -> str:
    """The layer-list name of a module: the first name under collabrl."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements under `node`, at any depth, `if TYPE_CHECKING:` ones included."""
    for child in ast.walk(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child


def _targets(
    module: str, is_package: bool, statement: ast.Import | ast.ImportFrom, modules: set[str]
) -> Iterator[str]:
    """The collabrl modules one import statement loads."""
    if isinstance(statement, ast.Import):
        yield from (a.name for a in statement.names)
        return
    base = statement.module or ""
    if statement.level:  # relative: resolved against the importer's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - statement.level + 1]
        base = ".".join([*package, *([base] if base else [])])
    for alias in statement.names:
        # `from collabrl.eval import runner` loads a module; `from collabrl.eval import X`
        # a name of the package.
        yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base


def collabrl_imports() -> list[Import]:
    """Every import of a collabrl module by a collabrl module, type-only ones included."""
    names = module_names()
    found: dict[Import, None] = {}  # one per line: `from x import a, b` is one import
    for module, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for statement in _imports(tree):
            for target in _targets(module, path.name == "__init__.py", statement, set(names)):
                if (target == PACKAGE or target.startswith(PACKAGE + ".")) and target != module:
                    found[Import(module, target, statement.lineno)] = None
    return list(found)


def layer_breaks(imports: list[Import]) -> list[str]:
    """Each import that reaches up or sideways, with the rule it breaks."""
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    breaks = []
    for imp in imports:
        src, dst = package_of(imp.importer), package_of(imp.imported)
        if src == dst:
            continue
        for package in (src, dst):
            if package not in layer:
                breaks.append(f"{imp}: package {package!r} is in no layer of LAYERS")
        if src not in layer or dst not in layer:
            continue
        if layer[dst] > layer[src]:
            breaks.append(
                f"{imp}: {src} (layer {layer[src]}) imports up into {dst} (layer {layer[dst]})"
            )
        elif layer[dst] == layer[src] and (src, dst) not in SAME_LAYER_EXCEPTIONS:
            breaks.append(f"{imp}: {src} imports {dst}, a package of its own layer {layer[src]}")
    return breaks


def import_cycles(imports: list[Import]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan), iteratively:
    each is a set of modules that import one another, directly or around a loop."""
    graph: dict[str, list[str]] = {}
    for imp in imports:
        graph.setdefault(imp.importer, []).append(imp.imported)
        graph.setdefault(imp.imported, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(graph[succ])))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:  # every successor seen: node is done
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(frozenset(component))
    return cycles


def test_every_package_is_in_a_layer_once() -> None:
    listed = [name for names in LAYERS for name in names]
    assert len(listed) == len(set(listed)), "a package is listed in two layers"
    packages = {package_of(m) for m in module_names()}
    assert packages == set(listed), (
        f"in no layer: {sorted(packages - set(listed))}; "
        f"listed but gone: {sorted(set(listed) - packages)}"
    )


def test_no_package_imports_up_or_sideways() -> None:
    breaks = layer_breaks(collabrl_imports())
    assert not breaks, "imports against the layers (tests/test_layers.py LAYERS):\n" + "\n".join(
        breaks
    )


def test_no_import_cycle_between_modules() -> None:
    imports = collabrl_imports()
    unknown = [c for c in import_cycles(imports) if c not in KNOWN_CYCLES]
    described = [
        " ⇄ ".join(sorted(cycle))
        + ":\n  "
        + "\n  ".join(str(i) for i in imports if i.importer in cycle and i.imported in cycle)
        for cycle in unknown
    ]
    assert not unknown, "modules that import one another:\n" + "\n".join(described)


def test_the_known_cycles_are_still_there() -> None:
    """A cycle broken must leave KNOWN_CYCLES too, or it could come back unnoticed."""
    gone = KNOWN_CYCLES - set(import_cycles(collabrl_imports()))
    assert not gone, "no longer a cycle, remove from KNOWN_CYCLES: " + "; ".join(
        " ⇄ ".join(sorted(c)) for c in gone
    )


def test_the_checker_sees_function_and_type_checking_imports() -> None:
    """The parser's rules on a small module: why the checks above can be trusted."""
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import collabrl.config\n"
        "if TYPE_CHECKING:\n"
        "    from collabrl.eval import runner\n"
        "else:\n"
        "    from collabrl import runs\n"
        "def f():\n"
        "    from collabrl.train.grpo import train_grpo\n"
    )
    modules = set(module_names())
    found = [
        t
        for s in _imports(tree)
        for t in _targets("collabrl.episode", False, s, modules)
        if t.startswith(PACKAGE)
    ]
    assert found == [
        "collabrl.config",
        "collabrl.eval.runner",
        "collabrl.runs",
        "collabrl.train.grpo",
    ]
