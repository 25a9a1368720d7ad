"""A partially local Keras model as a pure function of its weights.

The fast simulation engine runs many logical clients in lockstep, each with its own copy of the weights it
trains, stacked on a leading axis. That needs the model's forward pass as a *pure function* of
``(weights, inputs)`` that `tf.vectorized_map` can batch over clients. `FunctionalModel` gets it from any
model function built with `fedpersonal.models.from_keras_model`, without any model-specific code:

1. the model function is called once in a scratch graph, recording the order in which it creates variables and
   where each variable sits in the four `ReconstructionModel` groups (global/local x trainable/not);
2. on every call, the model function runs again inside a `tf.variable_creator_scope` that hands out the given
   weight tensors in that order instead of creating variables (TFF's `functional_model_from_keras` does the
   same with `clone_model`, but only inside a v1 graph and only for clonable models), and the rebuilt Keras
   model is applied to the inputs. The Keras model's regularization losses are functions of the same tensors.

Gradients of an embedding lookup with respect to a weight tensor are `tf.IndexedSlices`, which the engine
applies as sparse row updates.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from fedpersonal import errors
from fedpersonal.models import partially_local_model

ModelFn = Callable[[], Any]


class Parts(NamedTuple):
    """A model's weights in the four groups of a `tff.learning.models.ReconstructionModel` (lists of tensors)."""

    global_trainable: Sequence[Any]
    global_non_trainable: Sequence[Any]
    local_trainable: Sequence[Any]
    local_non_trainable: Sequence[Any]


GLOBAL_TRAINABLE, GLOBAL_NON_TRAINABLE, LOCAL_TRAINABLE, LOCAL_NON_TRAINABLE = range(4)


class FunctionalModel:
    """``model_fn``'s Keras model as a pure function ``(Parts, x, training) -> (predictions, regularization)``.

    `model_fn` returns a `fedpersonal.models.from_keras_model` model (its global/local split), or a plain Keras
    model (all its weights in the global groups).

    Attributes:
      initial_weights: The model's initial weights (`Parts` of numpy arrays): its seeded initializers' values.
      input_spec: The model's input spec.
      regularized: Whether the Keras model has regularization losses.
      unroll_rnns: Whether recurrent layers run unrolled (needs a static number of time steps; lets a client
        step of an LSTM vectorize over clients).

    Example:

    >>> import numpy as np
    >>> from fedpersonal.models import matrix_factorization as mf
    >>> model = FunctionalModel(mf.personal_model_fn(num_items=4, num_latent_factors=2))
    >>> [w.shape for w in model.initial_weights.global_trainable], [w.shape for w in model.initial_weights.local_trainable]
    ([(4, 2)], [(1, 2)])
    >>> weights = Parts([np.ones([4, 2], np.float32)], [], [np.full([1, 2], 0.5, np.float32)], [])
    >>> predictions, _ = model(weights, np.array([[1], [3]]))
    >>> predictions.numpy().ravel().tolist()
    [1.0, 1.0]
    """

    def __init__(self, model_fn: ModelFn, *, unroll_rnns: bool = True):
        self.unroll_rnns = unroll_rnns
        created: list[tf.Variable] = []

        def record(next_creator, **kwargs):
            variable = next_creator(**kwargs)
            created.append(variable)
            return variable

        with tf.Graph().as_default() as graph:
            with tf.variable_creator_scope(record):
                model = model_fn()
            groups: tuple[Sequence[Any], ...]
            if isinstance(model, tf.keras.Model):  # A plain Keras model: every weight is global.
                keras_model = model
                groups = (model.trainable_weights, model.non_trainable_weights, [], [])
            else:
                keras_model = getattr(model, 'keras_model', None)
                if not isinstance(keras_model, tf.keras.Model):
                    raise partially_local_model.ModelSpecError(
                        'The fast simulation engine needs a Keras model, or a model built with '
                        'fedpersonal.models.from_keras_model (a Keras model as a pure function of its weights); got '
                        f"{type(model).__name__}. Use simulation='per_client' for other ReconstructionModel "
                        'implementations.'
                    )
                groups = (
                    model.global_trainable_variables,
                    model.global_non_trainable_variables,
                    model.local_trainable_variables,
                    model.local_non_trainable_variables,
                )
            stateful = [
                layer.name for layer in keras_model.submodules if isinstance(layer, tf.keras.layers.BatchNormalization)
            ]
            if stateful:
                raise errors.ConfigError(
                    f'The fast simulation engine cannot run layers that update their own weights while training '
                    f"(BatchNormalization's moving statistics): {stateful}. Use simulation='per_client' for this model."
                )
            position = {id(v): (g, i) for g, variables in enumerate(groups) for i, v in enumerate(variables)}
            with tf.compat.v1.Session(graph=graph) as session:
                session.run(tf.compat.v1.variables_initializer(created))
                values = session.run([list(group) for group in groups])
                created_values = session.run(created)
            self.regularized = bool(keras_model.losses)
            self.input_spec = None if isinstance(model, tf.keras.Model) else model.input_spec
        self._model_fn = model_fn
        # For each created variable: its (group, index), or its initial value if it is in no group.
        self._sources: list[tuple[int, int] | np.ndarray] = [
            position.get(id(v), value) for v, value in zip(created, created_values)
        ]
        self.initial_weights = Parts(*[[np.asarray(v) for v in group] for group in values])

    def __call__(self, weights: Parts, x: Any, training: bool = True) -> tuple[Any, tf.Tensor]:
        """The predictions for inputs `x` and the regularization loss, as functions of `weights`."""
        if tf.executing_eagerly():  # Keras reads weight names while building, which eager tensors lack.
            return tf.function(self._call, autograph=False)(weights, x, training)
        return self._call(weights, x, training)

    def _call(self, weights: Parts, x: Any, training: bool) -> tuple[Any, tf.Tensor]:
        tensors = iter(
            [
                tf.constant(source)
                if isinstance(source, np.ndarray)
                else tf.convert_to_tensor(weights[source[0]][source[1]])
            ]
            for source in self._sources
        )

        def hand_out(next_creator, **kwargs):
            del next_creator, kwargs
            return next(tensors)[0]

        with tf.variable_creator_scope(hand_out), partially_local_model.weights_as_tensors():
            model = self._model_fn()
        keras_model = model if isinstance(model, tf.keras.Model) else model.keras_model
        rnns = [layer for layer in keras_model.submodules if isinstance(layer, tf.keras.layers.RNN)]
        if rnns and self.unroll_rnns:
            # An unrolled RNN has no tf.while_loop, so a step vectorizes over clients (pfor cannot batch the
            # TensorList of a while loop's gradient); the same arithmetic over a static number of time steps.
            for layer in rnns:
                layer.unroll, layer._could_use_gpu_kernel = True, False  # pylint: disable=protected-access
            try:
                predictions = keras_model(x, training=training)
            except ValueError as error:  # A time dimension unknown until run time cannot be unrolled.
                if 'unroll' not in str(error):
                    raise
                for layer in rnns:
                    layer.unroll = False
                predictions = keras_model(x, training=training)
        else:
            predictions = keras_model(x, training=training)
        losses = keras_model.losses
        return predictions, (tf.add_n(losses) if losses else tf.constant(0.0))
