"""TFF optimizers by name, for configs and flags."""

from __future__ import annotations

import tensorflow_federated as tff

from fedpersonal import errors

OPTIMIZERS = ('sgd', 'sgdm', 'adam', 'adagrad', 'yogi')


def build_optimizer(name: str, learning_rate: float) -> tff.learning.optimizers.Optimizer:
    """Returns a `tff.learning.optimizers.Optimizer`.

    Args:
      name: One of `OPTIMIZERS` (`sgdm` is SGD with momentum 0.9).
      learning_rate: The learning rate.

    Raises:
      ValueError: Unknown name or non-positive learning rate.
    """
    if learning_rate <= 0:
        raise errors.ConfigError(f'learning rate must be positive, got {learning_rate} for optimizer {name!r}.')
    if name == 'sgd':
        return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate)
    if name == 'sgdm':
        return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate, momentum=0.9)
    if name == 'adam':
        return tff.learning.optimizers.build_adam(learning_rate=learning_rate)
    if name == 'adagrad':
        return tff.learning.optimizers.build_adagrad(learning_rate=learning_rate)
    if name == 'yogi':
        return tff.learning.optimizers.build_yogi(learning_rate=learning_rate)
    raise errors.ConfigError(f'Unknown optimizer {name!r}; expected one of {OPTIMIZERS}.')
