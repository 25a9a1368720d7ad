"""Flags generated from config dataclasses: types, None values, shared flags between configs."""

import dataclasses

import pytest
from absl import flags

from fedpersonal.program import config_flags


@dataclasses.dataclass(frozen=True)
class A:
    output_dir: str
    rounds: int = 3
    steps: int | None = 50
    rate: float = 0.5
    names: tuple[str, ...] = ('x',)
    joint: bool = False


@dataclasses.dataclass(frozen=True)
class B:
    output_dir: str
    rounds: int = 7


def test_types_none_and_shared_flags():
    fv = flags.FlagValues()
    config_flags.define_flags(A, overrides={'output_dir': 'out/a'}, flag_values=fv)
    config_flags.define_flags(B, overrides={'output_dir': 'out/b'}, flag_values=fv)  # Shares output_dir, rounds.
    fv(['prog', '--steps=none', '--names=p,q', '--rate=0.25', '--joint'])
    a = config_flags.config_from_flags(A, overrides={'output_dir': 'out/a'}, flag_values=fv)
    assert a == A(output_dir='out/a', rounds=3, steps=None, rate=0.25, names=('p', 'q'), joint=True)
    b = config_flags.config_from_flags(B, overrides={'output_dir': 'out/b'}, flag_values=fv)
    assert b == B(output_dir='out/b', rounds=7)  # Its own defaults, not A's.
    fv.unparse_flags()
    fv(['prog', '--rounds=11', '--steps=9'])
    assert config_flags.config_from_flags(B, overrides={'output_dir': 'o'}, flag_values=fv).rounds == 11
    assert config_flags.config_from_flags(A, flag_values=fv, output_dir='x').steps == 9


def test_bad_optional_value_names_the_flag():
    fv = flags.FlagValues()
    config_flags.define_flags(A, flag_values=fv)
    fv(['prog', '--steps=lots'])
    with pytest.raises(flags.IllegalFlagValueError, match="--steps='lots'"):
        config_flags.config_from_flags(A, flag_values=fv, output_dir='x')


@dataclasses.dataclass(frozen=True)
class C:
    output_dir: str
    sizes: tuple[int, ...] = (1, 2)
    rates: tuple[float, ...] = (0.5,)


def test_numeric_tuple_flags_are_coerced_and_bad_items_named():
    fv = flags.FlagValues()
    config_flags.define_flags(C, flag_values=fv)
    fv(['prog', '--sizes=10,20', '--rates=0.1,1e-3'])
    assert config_flags.config_from_flags(C, flag_values=fv, output_dir='o') == C('o', (10, 20), (0.1, 0.001))
    fv.unparse_flags()
    fv(['prog', '--sizes=10,many'])
    with pytest.raises(flags.IllegalFlagValueError, match="--sizes='many'"):
        config_flags.config_from_flags(C, flag_values=fv, output_dir='o')


@pytest.mark.parametrize(
    'module, config', [('furl_personalization_config', 'FurlConfig'), ('movielens_mf_config', 'MovieLensMFConfig')]
)
def test_centralized_min_delta_is_a_documented_flag_of_the_rows_with_patience(module, config):
    import importlib  # pylint: disable=g-import-not-at-top

    from fedpersonal import errors  # pylint: disable=g-import-not-at-top

    config_cls = getattr(importlib.import_module(f'fedpersonal.tasks.{module}'), config)
    fv = flags.FlagValues()
    config_flags.define_flags(config_cls, flag_values=fv)
    assert 'centralized_patience' in fv['centralized_min_delta'].help
    fv(['prog', '--centralized_min_delta=0'])
    assert config_flags.config_from_flags(config_cls, flag_values=fv).centralized_min_delta == 0.0
    assert config_cls().centralized_min_delta == 1e-3  # A creeping validation metric stops early by default.
    with pytest.raises(errors.ConfigError, match='centralized_min_delta must be >= 0'):
        config_cls(centralized_min_delta=-0.1)
