"""The package's import structure: no import cycle anywhere, between modules or between subpackages, and
`fedpersonal.core` depends on nothing above it.

The layering (docs/ARCHITECTURE.md, "Layers"): core <- simulation <- backends <- algorithms <- evaluation <-
tff_compat / baselines / program <- tasks. A module may import from its own layer or below, never from above; a
cycle between two modules means a definition lives in the wrong one (move it down to the module that owns the
concept, or to a shared lower module). Between subpackages the arrows point one way too: ``algorithms ->
evaluation`` and ``evaluation -> algorithms`` in two different modules is no module cycle, but it makes the two
packages one layer (each package's ``__init__`` counts, with its re-exports; a top-level module such as
``fedpersonal.backends`` is a node of its own).

The graph is read from the sources (AST), so every import counts wherever it is written: at module level, inside
a function (a deferred import is still a dependency), and under ``if TYPE_CHECKING:`` (a type used in a signature
is a dependency of the design even if Python never executes the import; such a cycle is fixed by moving the type
down, like any other). One kind of edge is left out: a module importing one of its own ancestor packages (e.g.
``fedpersonal.program.training_loop`` importing ``fedpersonal.program`` for a sibling module). Python initializes
the package first anyway, and the package's ``__init__`` re-exports its modules, so counting that edge would make
every package with re-exports a cycle. ``from pkg import name`` is an edge to the module ``pkg.name`` when it is
one, else to ``pkg`` (its ``__init__``, whose own imports are edges like any module's).
"""

import ast
import pathlib

PACKAGE = 'fedpersonal'
ROOT = pathlib.Path(__file__).resolve().parent.parent
# What `fedpersonal.core` must never import: every layer above it.
ABOVE_CORE = (
    'fedpersonal.simulation',
    'fedpersonal.backends',
    'fedpersonal.algorithms',
    'fedpersonal.evaluation',
    'fedpersonal.baselines',
    'fedpersonal.tff_compat',
    'fedpersonal.tasks',
    'fedpersonal.program',
)
# What an algorithm must never import: the engine (a backend runs the algorithm's definition; `fedpersonal.backends`
# binds them).
# Nor anything above it: evaluation (which evaluates the algorithms' output), the TFF drop-in, the baselines, the
# program and the tasks.
NOT_IN_ALGORITHMS = (
    'fedpersonal.simulation',
    'fedpersonal.evaluation',
    'fedpersonal.tff_compat',
    'fedpersonal.baselines',
    'fedpersonal.program',
    'fedpersonal.tasks',
)


def _modules(root: pathlib.Path = ROOT, package: str = PACKAGE) -> dict[str, pathlib.Path]:
    """Dotted module name -> source file (a package is named by its ``__init__.py``)."""
    modules = {}
    for path in sorted((root / package).rglob('*.py')):
        parts = path.relative_to(root).with_suffix('').parts
        modules['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
    return modules


def _imported_names(module: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The dotted names `module` imports, anywhere in its source (relative imports resolved).

    ``from pkg import name`` gives ``pkg.name`` when that is a module, else ``pkg`` (a name defined in it).
    """
    package = module if path.name == '__init__.py' else module.rpartition('.')[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = package.split('.')
                base = '.'.join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names.update(f'{base}.{a.name}' if f'{base}.{a.name}' in modules else base for a in node.names)
    return names


def import_graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (see the module docstring for what counts)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition('.')[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        targets = {resolve(name) for name in _imported_names(module, path, modules) if name.split('.')[0] == PACKAGE}
        graph[module] = {t for t in targets if t and t != module and not module.startswith(t + '.')}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
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
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_the_package_has_no_import_cycle():
    found = cycles(import_graph(_modules()))
    assert not found, 'import cycles:\n' + '\n'.join(' <-> '.join(c) for c in found)


def _subpackage(module: str) -> str | None:
    """The subpackage (or top-level module) of the package that `module` belongs to; None for the package itself."""
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else None


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, str]]:
    """Subpackage -> {subpackage it imports: one import that makes the edge}, from the module graph."""
    edges: dict[str, dict[str, str]] = {}
    for module, targets in graph.items():
        source = _subpackage(module)
        if source is None:
            continue
        edges.setdefault(source, {})
        for target in sorted(targets):
            other = _subpackage(target)
            if other is not None and other != source:
                edges[source].setdefault(other, f'{module} -> {target}')
    return edges


def subpackage_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle between subpackages, each with one import per edge inside it."""
    edges = subpackage_graph(graph)
    found = []
    for component in cycles({source: set(targets) for source, targets in edges.items()}):
        members = set(component)
        found.append(
            ' <-> '.join(component)
            + ' ('
            + '; '.join(edges[a][b] for a in component for b in sorted(edges[a]) if b in members)
            + ')'
        )
    return found


def test_no_cycle_between_subpackages():
    found = subpackage_cycles(import_graph(_modules()))
    assert not found, 'cycles between subpackages:\n' + '\n'.join(found)


def _offending(package: str, forbidden: tuple[str, ...], root: pathlib.Path = ROOT) -> list[str]:
    """Every import, by a module of `package`, of a module in `forbidden` (or of one of those packages)."""
    modules = _modules(root)
    return sorted(
        f'{module} imports {name}'
        for module, path in modules.items()
        if module == package or module.startswith(package + '.')
        for name in _imported_names(module, path, modules)
        if any(name == layer or name.startswith(layer + '.') for layer in forbidden)
    )


def test_core_imports_nothing_above_it():
    offending = _offending(f'{PACKAGE}.core', ABOVE_CORE)
    assert not offending, '\n'.join(offending)


def test_algorithms_import_no_engine():
    offending = _offending(f'{PACKAGE}.algorithms', NOT_IN_ALGORITHMS)
    assert not offending, '\n'.join(offending)


def test_the_check_finds_a_cycle_through_a_function_level_and_a_type_checking_import(tmp_path):
    package = tmp_path / PACKAGE
    (package / 'sub').mkdir(parents=True)
    (package / '__init__.py').write_text('from fedpersonal import a\n')
    (package / 'sub' / '__init__.py').write_text('')
    (package / 'a.py').write_text('def f():\n    from fedpersonal.sub import b\n')
    (package / 'sub' / 'b.py').write_text(
        'from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fedpersonal import a\n'
    )
    (package / 'c.py').write_text('from . import a\nfrom .sub import b\n')
    graph = import_graph(_modules(tmp_path))
    assert graph['fedpersonal.c'] == {'fedpersonal.a', 'fedpersonal.sub.b'}
    assert cycles(graph) == [['fedpersonal.a', 'fedpersonal.sub.b']]


def test_the_layer_check_finds_a_function_level_import_of_the_engine(tmp_path):
    package = tmp_path / PACKAGE
    for sub in ('algorithms', 'simulation'):
        (package / sub).mkdir(parents=True)
        (package / sub / '__init__.py').write_text('')
    (package / '__init__.py').write_text('')
    (package / 'simulation' / 'driver.py').write_text('')
    (package / 'algorithms' / 'fedx.py').write_text('def f():\n    from fedpersonal.simulation import driver\n')
    found = _offending(f'{PACKAGE}.algorithms', NOT_IN_ALGORITHMS, tmp_path)
    assert found == ['fedpersonal.algorithms.fedx imports fedpersonal.simulation.driver']


def test_the_subpackage_check_finds_a_cycle_of_two_modules_that_is_no_module_cycle(tmp_path):
    """``a.x -> b.y`` and ``b.z -> a`` (a package's ``__init__``): no module cycle, but a and b are one layer."""
    package = tmp_path / PACKAGE
    for sub in ('a', 'b', 'c'):
        (package / sub).mkdir(parents=True)
    (package / '__init__.py').write_text('')
    (package / 'a' / '__init__.py').write_text('from fedpersonal.a.w import v\n')
    (package / 'a' / 'w.py').write_text('v = 1\n')
    (package / 'a' / 'x.py').write_text('def f():\n    from fedpersonal.b import y\n')
    (package / 'b' / '__init__.py').write_text('')
    (package / 'b' / 'y.py').write_text('')
    (package / 'b' / 'z.py').write_text('from fedpersonal import a\n')
    (package / 'c' / '__init__.py').write_text('from fedpersonal.a import x\nfrom fedpersonal.b import y\n')
    (package / 'top.py').write_text('from fedpersonal.c import x\n')
    graph = import_graph(_modules(tmp_path))
    assert cycles(graph) == []
    assert subpackage_cycles(graph) == [
        'a <-> b (fedpersonal.a.x -> fedpersonal.b.y; fedpersonal.b.z -> fedpersonal.a)'
    ]
    assert subpackage_graph(graph)['top'] == {'c': 'fedpersonal.top -> fedpersonal.c'}
