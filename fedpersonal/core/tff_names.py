"""TFF 0.87's argument names on fedpersonal's reconstruction builders, as aliases.

`tff.learning.algorithms.build_fed_recon` and `build_fed_recon_eval` name their arguments after factories
(`client_optimizer_fn`, `dataset_split_fn`, ...) where fedpersonal names the thing (`client_optimizer`,
`dataset_split`). The builders take both spellings: `resolve` picks the one given and refuses both (a `TypeError`
naming the two), so TFF code needs no renaming. TFF's argument values are accepted as TFF accepts them: an
optimizer is a `tff.learning.optimizers.Optimizer` or a no-arg function returning a Keras optimizer (the latter
only on the per-client path: the fast engine needs a functional optimizer and says so), a split function is any
``dataset -> (reconstruction dataset, post-reconstruction dataset)``, and ``None`` means the default.
"""

from __future__ import annotations

from typing import Any

# TFF 0.87 name -> fedpersonal name, for `build_fed_recon` (training) and the evaluation builders.
FED_RECON_ALIASES = {
    'server_optimizer_fn': 'server_optimizer',
    'client_optimizer_fn': 'client_optimizer',
    'reconstruction_optimizer_fn': 'reconstruction_optimizer',
    'model_aggregator_factory': 'model_aggregator',
    'dataset_split_fn': 'dataset_split',
}


def resolve(builder: str, name: str, value: Any, alias: str, alias_value: Any, default: Any = None) -> Any:
    """The value of argument `name` given as itself or as its TFF alias (`None`: not given), else `default`.

    Raises:
      TypeError: both `name` and `alias` were given.
    """
    if value is not None and alias_value is not None:
        raise TypeError(
            f"{builder}() got both {name!r} and {alias!r} (TFF's name for the same argument); pass only one."
        )
    if value is not None:
        return value
    if alias_value is not None:
        return alias_value
    return default


def refuse(builder: str, name: str, value: Any, reason: str) -> None:
    """Raises a `TypeError` naming a TFF argument `builder` does not support, if it was given (not None)."""
    if value is not None:
        raise TypeError(f"{builder}() does not support TFF's argument {name!r}: {reason}")
