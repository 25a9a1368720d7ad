"""The algorithms' registrations: each algorithm module declares its benchmark options and rows, and the
personalization benchmark's flags, validation, ``--help`` and rows come from them (no TensorFlow here).

An algorithm module (``fedpersonal/algorithms/<module>.py``) that runs in the benchmark binary declares:

* ``class BenchmarkOptions``, a frozen dataclass of its hyperparameters, each an `option` (default, help and
  bounds: ``minimum``, ``above``, ``maximum``, ``choices``); a ``__post_init__`` may check more, raising
  `errors.ConfigError`. Each field is the flag ``--<module>_<field>`` (a trailing underscore dropped, so
  ``lambda_`` of ``ditto`` is ``--ditto_lambda``).
* ``BENCHMARK_ROWS``, a tuple of `Row`: a value of ``--configurations``, its display name, a function building its
  client plan from the benchmark's `Settings` and the options, and what the benchmark needs to know of its model.

Defining the binary's flags must not import TensorFlow, and algorithm modules do: so `declarations` reads their
source with `ast` instead of importing them. ``BenchmarkOptions`` is compiled by itself from that source, in a
namespace holding only ``dataclasses``, ``registry`` (this module) and ``errors``, so it may use nothing else; each
`Row`'s name, display name and ``leaderboard`` position are literals. When the benchmark runs, `load_rows` imports the
modules, and the modules' own class checks the values again.

Example:

>>> moon = {d.module: d for d in declarations()}['moon']
>>> moon.rows, moon.flag('tau'), moon.options(tau=0.5).tau
((('moon', 'MOON', None),), 'moon_tau', 0.5)
>>> moon.options(tau=0.0)
Traceback (most recent call last):
...
fedpersonal.errors.ConfigError: --moon_tau must be > 0, got 0.0.
"""

from __future__ import annotations
import __future__

import ast
import dataclasses
import functools
import importlib
import importlib.util
import pathlib
import sys
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

from fedpersonal import errors

ALGORITHMS_DIR = pathlib.Path(__file__).parent / 'algorithms'
ALGORITHMS_PACKAGE = 'fedpersonal.algorithms'
OPTIONS_CLASS = 'BenchmarkOptions'
ROWS = 'BENCHMARK_ROWS'
# `Row.local_layers`: the model's last layer with weights, or its other layers with weights.
HEAD = 'head'
BODY = 'body'


def option(
    default: Any,
    help_text: str,
    *,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    choices: tuple[Any, ...] | None = None,
) -> Any:
    """An algorithm's benchmark option: its default, its flag's help and its bounds (checked naming the flag)."""
    bounds = {'minimum': minimum, 'above': above, 'maximum': maximum, 'choices': choices}
    metadata = {'help': help_text, **{k: v for k, v in bounds.items() if v is not None}}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every row's plan may read from the benchmark besides its own options.

    Attributes:
      client_epochs: Local epochs per round.
      client_learning_rate: The clients' SGD learning rate.
      batch_size: The clients' batch size.
      seed: The run's seed.
      personal_epochs: Epochs of a personal model per round (Ditto, APFL).
      num_clients: The clients a round samples, at most (FedAMP's table rows).
    """

    client_epochs: int
    client_learning_rate: float
    batch_size: int
    seed: int
    personal_epochs: int
    num_clients: int

    def sgd(self) -> Any:
        """A fresh TFF SGD optimizer at ``client_learning_rate`` (PFLlib's clients' optimizer)."""
        import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

        return tff.learning.optimizers.build_sgdm(learning_rate=self.client_learning_rate)


@dataclasses.dataclass(frozen=True)
class Row:
    """A benchmark row an algorithm module declares (``BENCHMARK_ROWS``).

    Attributes:
      name: Its value of ``--configurations`` (a literal).
      display_name: Its name in tables (a literal).
      plan: ``plan(settings, options)``, its `fedpersonal.core.client_plan.ClientPlan`.
      leaderboard: Its position among PFLlib's leaderboard rows run by default (a literal); None: run when named.
      local_layers: The model's layers kept on the clients: `HEAD`, `BODY` or layer names.
      finetune: Each client fine-tunes its whole model on its train data before evaluation.
      adapts: Evaluated after one local step (Per-FedAvg's).
      phased_model: ``phased_model(keras_model, num_classes)``, the model of a plan with model-defined losses.
      uniform_weighting: The server weighs clients equally (else by their train examples).
      keras_transform: The method's own layers around the benchmark's Keras model.
    """

    name: str
    display_name: str
    plan: Callable[[Settings, Any], Any]
    leaderboard: int | None = None
    local_layers: str | tuple[str, ...] = ()
    finetune: bool = False
    adapts: bool = False
    phased_model: Callable[[Any, int], Any] | None = None
    uniform_weighting: bool = False
    keras_transform: Callable[[Any], Any] | None = None


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What one algorithm module declares, read from its source.

    Attributes:
      module: The module's name (``fedpersonal.algorithms.<module>``), its flags' prefix.
      rows: ``(name, display_name, leaderboard)`` of each of its rows.
      options_class: ``BenchmarkOptions`` compiled from its source, or None when it declares no options.
      path: The module's file.
    """

    module: str
    rows: tuple[tuple[str, str, int | None], ...]
    options_class: type | None
    path: pathlib.Path

    def fields(self) -> tuple[dataclasses.Field, ...]:
        return dataclasses.fields(self.options_class) if self.options_class else ()

    def flag(self, field: str) -> str:
        """The flag of option `field`."""
        return f'{self.module}_{field.rstrip("_")}'

    def options(self, options_class: type | None = None, **values: Any) -> Any:
        """The options from field values (defaults for the others), checked; errors name the flags."""
        cls = options_class or self.options_class
        if cls is None:
            if values:
                raise errors.ConfigError(f'{self.module} declares no options, got {sorted(values)}.')
            return None
        try:
            options = cls(**values)
        except errors.ConfigError as e:
            raise errors.ConfigError(f'{self.module} options (--{self.module}_*): {e}') from None
        for field in dataclasses.fields(options):
            _check_bounds(self.flag(field.name), getattr(options, field.name), field.metadata)
        return options


def _check_bounds(flag: str, value: Any, bounds: Mapping[str, Any]) -> None:
    for key, fails, relation in (
        ('minimum', lambda v, b: v < b, '>='),
        ('above', lambda v, b: v <= b, '>'),
        ('maximum', lambda v, b: v > b, '<='),
    ):
        if key in bounds and fails(value, bounds[key]):
            raise errors.ConfigError(f'--{flag} must be {relation} {bounds[key]}, got {value}.')
    if 'choices' in bounds and value not in bounds['choices']:
        raise errors.ConfigError(f'--{flag} must be one of {bounds["choices"]}, got {value!r}.')


def _literal(node: ast.expr, path: pathlib.Path) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise errors.ConfigError(
            f'{path}:{node.lineno}: a {ROWS} entry needs literal name, display_name and leaderboard.'
        ) from None


def _rows(node: ast.Assign, path: pathlib.Path) -> tuple[tuple[str, str, int | None], ...]:
    if not isinstance(node.value, ast.Tuple):
        raise errors.ConfigError(f'{path}:{node.lineno}: {ROWS} must be a tuple of registry.Row(...).')
    rows = []
    for call in node.value.elts:
        if not isinstance(call, ast.Call) or len(call.args) < 2:
            raise errors.ConfigError(f'{path}:{call.lineno}: expected registry.Row(name, display_name, plan, ...).')
        keywords = {k.arg: k.value for k in call.keywords}
        leaderboard = _literal(keywords['leaderboard'], path) if 'leaderboard' in keywords else None
        rows.append((_literal(call.args[0], path), _literal(call.args[1], path), leaderboard))
    return tuple(rows)


def _options_class(node: ast.ClassDef, path: pathlib.Path) -> type:
    code = compile(
        ast.Module(body=[node], type_ignores=[]),
        str(path),
        'exec',
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    namespace: dict[str, Any] = {
        '__name__': __name__,  # A module dataclasses finds in sys.modules (the declaring one is not imported).
        'dataclasses': dataclasses,
        'errors': errors,
        'registry': importlib.import_module(__name__),
    }
    try:
        exec(code, namespace)  # pylint: disable=exec-used
    except NameError as e:
        raise errors.ConfigError(
            f'{path}:{node.lineno}: {OPTIONS_CLASS} may use only dataclasses, registry and errors ({e}).'
        ) from None
    return namespace[OPTIONS_CLASS]


def read_declaration(path: pathlib.Path) -> Declaration | None:
    """The declaration of the module at `path`, or None when it declares no rows."""
    tree = ast.parse(path.read_text(), str(path))
    rows: tuple[tuple[str, str, int | None], ...] = ()
    options_class = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == ROWS for t in node.targets):
            rows = _rows(node, path)
        elif isinstance(node, ast.ClassDef) and node.name == OPTIONS_CLASS:
            options_class = _options_class(node, path)
    if not rows:
        return None
    return Declaration(path.stem, rows, options_class, path)


@functools.cache
def declarations(directory: pathlib.Path = ALGORITHMS_DIR) -> tuple[Declaration, ...]:
    """Every declaration of the algorithm modules in `directory`, by module name; row names are unique."""
    found = [d for p in sorted(directory.glob('*.py')) if (d := read_declaration(p)) is not None]
    seen: dict[str, str] = {}
    for declaration in found:
        for name, _, _ in declaration.rows:
            if name in seen:
                raise errors.ConfigError(f'row {name!r} is declared by both {seen[name]} and {declaration.module}.')
            seen[name] = declaration.module
    return tuple(found)


def row_names(found: tuple[Declaration, ...]) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    """(the leaderboard rows in their order, the other rows by name, every row's display name)."""
    rows = [row for d in found for row in d.rows]
    leaderboard = tuple(
        name for name, _, position in sorted((r for r in rows if r[2] is not None), key=lambda r: r[2] or 0)
    )
    others = tuple(sorted(name for name, _, position in rows if position is None))
    return leaderboard, others, {name: display for name, display, _ in rows}


def add_option_fields(found: tuple[Declaration, ...]) -> Callable[[type], type]:
    """A class decorator (under ``@dataclasses.dataclass``) adding a field per declared option, named by its flag."""

    def add(cls: type) -> type:
        annotations = cls.__dict__.get('__annotations__', {})
        for declaration in found:
            for field in declaration.fields():
                flag = declaration.flag(field.name)
                annotations[flag] = field.type
                setattr(cls, flag, dataclasses.field(default=field.default, metadata=dict(field.metadata)))
        cls.__annotations__ = annotations
        return cls

    return add


def options_from(declaration: Declaration, config: Any, options_class: type | None = None) -> Any:
    """`declaration`'s options from a config holding their flags' fields (`add_option_fields`), checked."""
    values = {f.name: getattr(config, declaration.flag(f.name)) for f in declaration.fields()}
    return declaration.options(options_class, **values)


def _import(declaration: Declaration) -> Any:
    """The declaring module: ``fedpersonal.algorithms.<module>``, or a module file elsewhere by its path."""
    if declaration.path.parent == ALGORITHMS_DIR:
        return importlib.import_module(f'{ALGORITHMS_PACKAGE}.{declaration.module}')
    spec = importlib.util.spec_from_file_location(f'_registered_{declaration.module}', declaration.path)
    if spec is None or spec.loader is None:
        raise errors.ConfigError(f'{declaration.path}: not an importable module.')
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # As an import does (dataclasses looks its module up).
    spec.loader.exec_module(module)
    return module


def load_rows(found: tuple[Declaration, ...]) -> dict[str, tuple[Row, Declaration, type | None]]:
    """Imports each declaring module: every row with its declaration and the module's own options class."""
    rows = {}
    for declaration in found:
        module = _import(declaration)
        declared = tuple((r.name, r.display_name, r.leaderboard) for r in getattr(module, ROWS))
        if declared != declaration.rows:  # Only if the source changed since it was read.
            raise errors.ConfigError(f'{declaration.path}: {ROWS} differs from its source as read: {declared}.')
        for row in getattr(module, ROWS):
            rows[row.name] = (row, declaration, getattr(module, OPTIONS_CLASS, None))
    return rows
