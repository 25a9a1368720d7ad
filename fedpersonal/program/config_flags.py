"""absl flags generated from a typed experiment config dataclass.

One definition of every option (the dataclass field, its type and default) is
turned into a flag, and the parsed flags back into a frozen config instance:
flags/flagfile -> config -> builders.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Optional, Sequence

from absl import flags

_NONE = 'none'


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(type, optional) of a field annotation such as `Optional[int]`."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {'Optional': Optional, 'tuple': tuple})  # pylint: disable=eval-used
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], True
    return annotation, False


def define_flags(config_cls: type, *, exclude: Sequence[str] = (), overrides: Optional[dict[str, Any]] = None,
                 flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines one flag per field of `config_cls` (a dataclass).

    `Optional[...]` fields accept the string 'none'; `tuple[str, ...]` fields
    are comma-separated lists. Help text comes from the field's `help` metadata
    if present.
    """
    overrides = overrides or {}
    for field in dataclasses.fields(config_cls):
        if field.name in exclude:
            continue
        default = overrides.get(field.name, field.default if field.default is not dataclasses.MISSING else None)
        base, optional = _base_type(field.type)
        help_text = field.metadata.get('help', f'{config_cls.__name__}.{field.name}')
        if typing.get_origin(base) is tuple:
            flags.DEFINE_list(field.name, list(default) if default is not None else None, help_text, flag_values=flag_values)
        elif base is bool:
            flags.DEFINE_bool(field.name, default, help_text, flag_values=flag_values)
        elif optional:
            flags.DEFINE_string(field.name, _NONE if default is None else str(default),
                                f'{help_text} ({_NONE!r} for None)', flag_values=flag_values)
        elif base is int:
            flags.DEFINE_integer(field.name, default, help_text, flag_values=flag_values)
        elif base is float:
            flags.DEFINE_float(field.name, default, help_text, flag_values=flag_values)
        else:
            flags.DEFINE_string(field.name, default, help_text, flag_values=flag_values)


def config_from_flags(config_cls: type, *, flag_values: flags.FlagValues = flags.FLAGS, **fixed: Any) -> Any:
    """Builds a `config_cls` instance from parsed flags (plus `fixed` values).

    Raises:
      flags.IllegalFlagValueError: an Optional flag that is neither 'none' nor
        a value of the field's type (the message names the flag).
    """
    values = dict(fixed)
    for field in dataclasses.fields(config_cls):
        if field.name in values or field.name not in flag_values:
            continue
        raw = flag_values[field.name].value
        base, optional = _base_type(field.type)
        if typing.get_origin(base) is tuple:
            raw = tuple(raw or ())
        elif optional:
            if raw is None or str(raw).lower() == _NONE:
                raw = None
            else:
                try:
                    raw = base(raw)
                except ValueError:
                    raise flags.IllegalFlagValueError(
                        f'--{field.name}={raw!r}: expected {base.__name__} or {_NONE!r}.'
                    ) from None
        values[field.name] = raw
    return config_cls(**values)
