"""absl flags generated from a typed experiment config dataclass.

One definition of every option (the dataclass field, its type and default) is
turned into a flag, and the parsed flags back into a frozen config instance:
flags/flagfile -> config -> builders.

The flags of a config are the key flags of `help_module(config_cls)`, so a binary's help lists exactly them
(`flags.FLAGS.module_help(help_module(config_cls))`, as `experiment_main` prints for `--help`). Importing this
module imports neither TensorFlow nor TFF (tests/program/help_test.py).

A field's deprecated names (`config_parts.option(..., aliases=...)`) are flags too (not listed by the short help):
an old name, on the command line or in a flagfile, gives the same config as the new one, with one warning naming
the new flag; giving both is an `IllegalFlagValueError` naming both.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from typing import Any
from typing import Optional

from absl import flags
from absl import logging

from fedpersonal.program import config_parts

_NONE = 'none'


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(type, optional) of a field annotation such as `int | None` or `Optional[int]`."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {'Optional': Optional, 'tuple': tuple})  # pylint: disable=eval-used
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], True
    return annotation, False


def help_module(config_cls: type) -> str:
    """The name under which `define_flags` registers the flags of `config_cls` as key flags.

    Args:
      config_cls: A config dataclass.

    Returns:
      Its qualified name, e.g. 'fedpersonal.tasks.feddva_config.FeddvaConfig': the heading of its flags in
      `flags.FLAGS.module_help(...)`.
    """
    return f'{config_cls.__module__}.{config_cls.__qualname__}'


def define_flags(
    config_cls: type,
    *,
    exclude: Sequence[str] = (),
    overrides: dict[str, Any] | None = None,
    flag_values: flags.FlagValues = flags.FLAGS,
) -> None:
    """Defines one flag per field of `config_cls` (a dataclass).

    `Optional[...]` fields accept the string 'none'; `tuple[str, ...]` fields
    are comma-separated lists. Help text comes from the field's `help` metadata
    if present. A flag another config already defined (several binaries in one
    process, e.g. a test session) is shared; `config_from_flags` then takes its
    value only if it was given, and this config's own default otherwise.
    Every flag of the config (shared or not) is a key flag of
    `help_module(config_cls)`, so `flag_values.module_help(help_module(config_cls))`
    lists them all with their help and default.

    Args:
      config_cls: The config dataclass.
      exclude: Fields that get no flag.
      overrides: Flag defaults that differ from the dataclass defaults (e.g. a binary's `output_dir`).
      flag_values: Where the flags are defined.
    """
    overrides = overrides or {}
    module = help_module(config_cls)
    for field in dataclasses.fields(config_cls):
        if field.name in exclude:
            continue
        if field.name not in flag_values:
            _define_flag(config_cls, field, field.name, overrides, flag_values)
        flag_values.register_key_flag_for_module(module, flag_values[field.name])
        for alias in config_parts.aliases(config_cls, field.name):
            if alias not in flag_values:
                _define_flag(config_cls, field, alias, {alias: None}, flag_values)


def _define_flag(
    config_cls: type, field: dataclasses.Field, name: str, overrides: dict[str, Any], flag_values: flags.FlagValues
) -> None:
    """Defines the flag `name` of one field: its own name or a deprecated alias (no default; see `define_flags`)."""
    default = overrides.get(name, field.default if field.default is not dataclasses.MISSING else None)
    base, optional = _base_type(field.type)
    help_text = config_parts.help_text(config_cls, field.name) or f'{config_cls.__name__}.{field.name}'
    if name != field.name:
        help_text = f'Deprecated name of --{field.name} (removed in the next release): {help_text}'

    if typing.get_origin(base) is tuple:
        flags.DEFINE_list(name, list(default) if default is not None else None, help_text, flag_values=flag_values)
    elif base is bool:
        flags.DEFINE_bool(name, default, help_text, flag_values=flag_values)
    elif optional:
        flags.DEFINE_string(
            name,
            None if name != field.name else _NONE if default is None else str(default),
            f'{help_text} ({_NONE!r} for None)',
            flag_values=flag_values,
        )
    elif base is int:
        flags.DEFINE_integer(name, default, help_text, flag_values=flag_values)
    elif base is float:
        flags.DEFINE_float(name, default, help_text, flag_values=flag_values)
    else:
        flags.DEFINE_string(name, default, help_text, flag_values=flag_values)


def _coerce(name: str, raw: Any, base: type, optional: bool) -> Any:
    """`raw` as `base` (a shared flag may have been defined with another config's type)."""
    if base is bool and isinstance(raw, str):
        if raw.lower() in ('true', '1', 'yes'):
            return True
        if raw.lower() in ('false', '0', 'no'):
            return False
    elif base in (int, float, str):
        try:
            return base(raw)
        except (TypeError, ValueError):
            pass
    else:
        return raw
    expected = 'true or false' if base is bool else base.__name__ + (f' or {_NONE!r}' if optional else '')
    raise flags.IllegalFlagValueError(f'--{name}={raw!r}: expected {expected}.')


def config_from_flags(
    config_cls: type,
    *,
    overrides: dict[str, Any] | None = None,
    flag_values: flags.FlagValues = flags.FLAGS,
    **fixed: Any,
) -> Any:
    """Builds a `config_cls` instance from parsed flags (plus `fixed` values).

    Flags that were not given on the command line or in a flagfile take the
    config's default (or `overrides`, the same dict given to `define_flags`).

    A field's deprecated flag names count as its own (with a warning).

    Raises:
      flags.IllegalFlagValueError: an Optional flag that is neither 'none' nor
        a value of the field's type (the message names the flag); a field given
        under two of its names.
    """
    values = dict(fixed)
    overrides = overrides or {}
    for field in dataclasses.fields(config_cls):
        if field.name in values or field.name not in flag_values:
            continue
        name = _given_name(config_cls, field.name, flag_values)
        if name is None:
            if field.name in overrides:
                values[field.name] = overrides[field.name]
            continue  # The dataclass default applies.
        raw = flag_values[name].value
        base, optional = _base_type(field.type)
        if typing.get_origin(base) is tuple:
            raw = tuple(raw.split(',') if isinstance(raw, str) else (raw or ()))
            element = (typing.get_args(base) or (str,))[0]
            if element in (int, float):
                raw = tuple(_coerce(name, item, element, False) for item in raw)
        elif optional and (raw is None or str(raw).lower() == _NONE):
            raw = None
        else:
            raw = _coerce(name, raw, base, optional)
        values[field.name] = raw
    return config_cls(**values)


def _given_name(config_cls: type, name: str, flag_values: flags.FlagValues) -> str | None:
    """Which of the flag `name` and its deprecated aliases was given (None: neither); a deprecated one is logged.

    Raises:
      flags.IllegalFlagValueError: More than one was given.
    """
    given = [n for n in (name, *config_parts.aliases(config_cls, name)) if n in flag_values and flag_values[n].present]
    if len(given) > 1:
        listed = ' and '.join(f'--{n}' for n in given)
        raise flags.IllegalFlagValueError(
            f'{listed} are the same option (--{name}; the others are its deprecated names): give only --{name}.'
        )
    if not given:
        return None
    if given[0] != name:
        logging.warning(
            '--%s is deprecated and will be removed in the next release: use --%s (same meaning).', given[0], name
        )
    return given[0]
