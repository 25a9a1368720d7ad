"""A user's Keras model by import path (the benchmark binary's ``--model=module:function``), checked up front.

`load_factory` imports ``module`` and takes its ``function``; `build` calls it with those of ``input_shape``,
``num_classes`` and ``seed`` its signature accepts (all of them with ``**kwargs``; one that takes no ``seed`` is
called with Python's, NumPy's and TF's global seeds set to it, then restored, so that its unseeded initializers give
the same weights on every call: same seed, same numbers) and checks what it returns: a
``tf.keras.Model`` taking the images (``[batch, H, W, C]``) and giving ``[batch, num_classes]`` logits. `head_layer`
is the model's last layer, which methods with a local head keep on the clients: it must be a ``Dense`` layer. Every
problem is a `ConfigError` naming the flag, not a stack trace from inside Keras.

Example:

>>> model = build('fedpersonal.models.image_classifiers:small_cnn', (8, 8, 1), 10, seed=0)
>>> head_layer(model, 'fedper').name
'fc'
>>> build('fedpersonal.models.image_classifiers:small_cnn', (8, 8, 1), 10, seed=0, expected_classes=3)
Traceback (most recent call last):
...
fedpersonal.errors.ConfigError: --model=...: the model outputs shape [None, 10]; the data has 3 classes (logits [batch, 3]).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import random
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from fedpersonal import errors

__all__ = ['load_factory', 'build', 'head_layer']

FLAG = '--model'
ARGUMENTS = ('input_shape', 'num_classes', 'seed')


def load_factory(spec: str, flag: str = FLAG) -> Callable[..., Any]:
    """The callable ``function`` of module ``module`` named by `spec` (``'module:function'``)."""
    module_name, _, name = spec.partition(':')
    if not module_name or not name:
        raise errors.ConfigError(f"{flag}={spec}: expected a Keras model factory as 'module:function'.")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # The user's module: any error while importing it.
        raise errors.ConfigError(
            f'{flag}={spec}: cannot import module {module_name!r} ({type(error).__name__}: {error}); is it on '
            'PYTHONPATH (or installed)?'
        ) from None
    factory = getattr(module, name, None)
    if factory is None:
        raise errors.ConfigError(f'{flag}={spec}: module {module_name!r} has no {name!r}.')
    if not callable(factory):
        raise errors.ConfigError(f'{flag}={spec}: {name!r} is a {type(factory).__name__}, not a callable factory.')
    return factory


def _arguments(factory: Callable[..., Any], offered: dict[str, Any], spec: str, flag: str) -> dict[str, Any]:
    """Those of `offered` that `factory` accepts; a required parameter it has beyond them is an error."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # No signature (some builtins): offer nothing.
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(offered)
    unknown = [
        p.name
        for p in parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and p.name not in offered
    ]
    if unknown:
        raise errors.ConfigError(
            f'{flag}={spec}: the factory requires {unknown}; it is called with keywords among {list(ARGUMENTS)} '
            'only (give the others defaults).'
        )
    return {k: v for k, v in offered.items() if k in parameters}


@contextlib.contextmanager
def _global_seeds(seed: int) -> Iterator[None]:
    """Python's, NumPy's and TF's global random state seeded with `seed` (as `tf.keras.utils.set_random_seed`) inside
    the block, and put back after it."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    tf_seed, _ = tf.compat.v1.get_seed(None)
    tf.keras.utils.set_random_seed(seed)
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        tf.random.set_seed(tf_seed)


@tf.autograph.experimental.do_not_convert  # Called in a model_fn traced by TFF: the user's Python, as is.
def build(
    spec: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    seed: int = 0,
    expected_classes: int | None = None,
    flag: str = FLAG,
) -> tf.keras.Model:
    """The model of factory `spec` for images of `input_shape` ``(H, W, C)`` and `num_classes` classes, checked.

    Args:
      spec: ``'module:function'``.
      input_shape: One image's shape.
      num_classes: Passed to the factory (if it takes it).
      seed: Passed to the factory if it takes it, else the global seeds while it runs: the same initial weights
        each call.
      expected_classes: The logits the data needs (default `num_classes`).
      flag: The flag named by the errors.

    Raises:
      errors.ConfigError: The factory cannot be imported or called, does not return a Keras model, or the model
        does not take `input_shape` images or give ``[batch, expected_classes]`` logits.
    """
    factory = load_factory(spec, flag)
    kwargs = _arguments(factory, dict(input_shape=tuple(input_shape), num_classes=num_classes, seed=seed), spec, flag)
    seeded = contextlib.nullcontext() if 'seed' in kwargs else _global_seeds(seed)
    try:
        with seeded:
            model = factory(**kwargs)
    except Exception as error:  # The user's code: any error while building the model.
        raise errors.ConfigError(
            f'{flag}={spec}: calling it with {kwargs} failed ({type(error).__name__}: {error}).'
        ) from None
    if not isinstance(model, tf.keras.Model):
        raise errors.ConfigError(
            f'{flag}={spec}: returned a {type(model).__name__}, expected a tf.keras.Model (uncompiled).'
        )
    if not model.built or not model.inputs:
        raise errors.ConfigError(
            f'{flag}={spec}: the model has no input shape; start it with tf.keras.Input(input_shape) (a Sequential '
            'or functional model).'
        )
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise errors.ConfigError(
            f'{flag}={spec}: the model has {len(model.inputs)} inputs and {len(model.outputs)} outputs; expected one '
            'of each (images in, logits out).'
        )
    takes = list(model.inputs[0].shape)[1:]
    if len(takes) != len(input_shape) or any(t is not None and t != s for t, s in zip(takes, input_shape)):
        raise errors.ConfigError(
            f'{flag}={spec}: the model takes inputs of shape {[None, *takes]}; the images are '
            f'{[None, *input_shape]} (batch, height, width, channels).'
        )
    gives = list(model.outputs[0].shape)
    classes = num_classes if expected_classes is None else expected_classes
    if len(gives) != 2 or gives[1] != classes:
        raise errors.ConfigError(
            f'{flag}={spec}: the model outputs shape {gives}; the data has {classes} classes (logits [batch, {classes}]).'
        )
    last = model.layers[-1] if model.layers else None
    activation = getattr(getattr(last, 'activation', None), '__name__', None)
    if isinstance(last, tf.keras.layers.Softmax) or activation in ('softmax', 'sigmoid'):
        raise errors.ConfigError(
            f'{flag}={spec}: the model ends in a {activation or "softmax"}; the loss takes logits: end it with '
            'tf.keras.layers.Dense(num_classes) (no activation).'
        )
    return model


def head_layer(model: tf.keras.Model, method: str, spec: str | None = None, flag: str = FLAG) -> tf.keras.layers.Layer:
    """The model's head, its last layer, for `method` (which keeps it, or the other layers, on the clients).

    Raises:
      errors.ConfigError: The last layer is not a ``Dense`` layer giving the model's output from the layer before.
    """
    named = f'{flag}={spec}' if spec else 'the model'
    layers = model.layers
    last = layers[-1] if layers else None
    if not isinstance(last, tf.keras.layers.Dense):
        kind = type(last).__name__ if last is not None else 'no layer'
        raise errors.ConfigError(
            f'{named}: {method} keeps a head on the clients, the last layer, which must be a Dense layer giving the '
            f'logits; the last layer is {kind}. End the model with tf.keras.layers.Dense(num_classes) (no softmax).'
        )
    if len(layers) < 2 or not any(p.weights for p in layers[:-1]):
        raise errors.ConfigError(
            f'{named}: {method} splits the model into a body and a head (its last Dense layer); the model has no '
            'layer with weights before the head.'
        )
    if last.output is not model.outputs[0] or last.input is not layers[-2].output:
        raise errors.ConfigError(
            f"{named}: {method}'s head is the last Dense layer, which must take the previous layer's output and give "
            "the model's output (a chain, as tf.keras.Sequential builds)."
        )
    return last
