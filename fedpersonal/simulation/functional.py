"""A partially local model as a pure function of its weights.

The fast simulation engine runs many logical clients in lockstep, each with its own copy of the weights it
trains, stacked on a leading axis. That needs the model's forward pass as a *pure function* of
``(weights, inputs)`` that `tf.vectorized_map` can batch over clients. `FunctionalModel` gets it from any
model function, without any model-specific code:

1. the model function is called once in a scratch graph, recording the order in which it creates variables and
   where each variable sits in the four `ReconstructionModel` groups (global/local x trainable/not);
2. on every call, the model function runs again inside a `tf.variable_creator_scope` that hands out the given
   weight tensors in that order instead of creating variables (TFF's `functional_model_from_keras` does the
   same with `clone_model`, but only inside a v1 graph and only for clonable models). The rebuilt model is a
   pure function of those tensors: a Keras model is applied to the inputs (`__call__`, `apply`), and any other
   model object is handed to the caller (`rebuild`), who calls its own methods (e.g. a loss) on it. The Keras
   models' regularization losses are functions of the same tensors.

Models: a `fedpersonal.models.from_keras_model` model (its global/local split), a plain Keras model (all its
weights global), or any object whose variables ``groups(model)`` sorts into the four groups, its Keras parts
being its attributes that are Keras layers.

BatchNormalization (``batch_norm=True``): a training-mode call updates the layer's moving statistics, which
the per-client path assigns to its variables. In a rebuilt model each layer records the value it would assign
instead (`Rebuilt.updates`, by weight slot), so the caller carries them as per-client state; a later call of
the same rebuilt layer reads the recorded value, as the per-client path reads the assigned variable. Padded
examples must not change the batch statistics: with an ``example_mask`` (``[batch]``, 1 for a real example)
every batch norm layer computes its moments over the real examples only (the non-fused implementation with
`tf.nn.weighted_moments`), which equals the per-client path's statistics over its unpadded batch (the biased
batch variance, as Keras' fused and non-fused paths both use). The inputs of every batch norm layer must then
have the examples on their first axis. Other layers that assign their own variables are refused.

Gradients of an embedding lookup with respect to a weight tensor are `tf.IndexedSlices`, which the engine
applies as sparse row updates.

Recurrent layers: a Keras LSTM with its default arithmetic runs as TensorFlow's fused `BlockLSTM` kernel
(`fedpersonal.simulation.fused_lstm`); other recurrent layers run unrolled, so that their gradient has no
`tf.while_loop`, which `pfor` cannot batch over clients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from fedpersonal import errors
from fedpersonal.models import partially_local_model
from fedpersonal.simulation import fused_lstm

ModelFn = Callable[[], Any]
Slot = tuple[int, int]  # (group, index) of a weight in `Parts`.
GroupsFn = Callable[[Any], Sequence[Sequence[Any]]]


class Parts(NamedTuple):
    """A model's weights in the four groups of a `tff.learning.models.ReconstructionModel` (lists of tensors)."""

    global_trainable: Sequence[Any]
    global_non_trainable: Sequence[Any]
    local_trainable: Sequence[Any]
    local_non_trainable: Sequence[Any]


GLOBAL_TRAINABLE, GLOBAL_NON_TRAINABLE, LOCAL_TRAINABLE, LOCAL_NON_TRAINABLE = range(4)


class Rebuilt(NamedTuple):
    """A model rebuilt from weight tensors (`FunctionalModel.rebuild`).

    Attributes:
      model: The model object `model_fn` returns, its variables replaced by the given tensors.
      updates: Filled while the model runs in training mode: ``{slot: new value}`` of the weights its layers
        update themselves (batch norm moving statistics).
    """

    model: Any
    updates: dict[Slot, tf.Tensor]


def keras_parts(model: Any) -> list[tf.keras.layers.Layer]:
    """The Keras layers (models) of a model object: itself, its ``keras_model``, or its Keras-layer attributes."""
    if isinstance(model, tf.keras.layers.Layer):
        return [model]
    keras_model = partially_local_model.keras_model_of(model)
    if isinstance(keras_model, tf.keras.layers.Layer):
        return [keras_model]
    return [v for v in vars(model).values() if isinstance(v, tf.keras.layers.Layer)]


def _batch_norms(model: Any) -> list[Any]:
    """The batch norm layers of a model object, in a deterministic order (each once)."""
    found: list[Any] = []
    for part in keras_parts(model):
        for layer in [part, *part.submodules]:
            if isinstance(layer, _BATCH_NORM) and all(layer is not f for f in found):
                found.append(layer)
    return found


_BATCH_NORM = tf.keras.layers.BatchNormalization.__mro__[1]  # Keras' BatchNormalizationBase (also Sync...).
# Layers whose client steps run slower compiled by XLA on the CPU than as a plain TF graph (measured, engine round):
# the next-word LSTM (unrolled) 0.65 vs 0.25 s, FedDVA's convolutions 17 vs 3.5 s. Embedding and dense models
# (matrix factorization, FURL) run about 3.5x faster with XLA.
# pfor has no converter for a convolution whose filters differ per client (it logs an error and falls back to a loop).
_CONV_LAYERS = (tf.keras.layers.Conv1D, tf.keras.layers.Conv2D, tf.keras.layers.Conv3D)
_NO_XLA_LAYERS = (tf.keras.layers.RNN, *_CONV_LAYERS)
_MATMUL_LAYERS = (tf.keras.layers.Dense, tf.keras.layers.EinsumDense, *_NO_XLA_LAYERS)


class FunctionalModel:
    """``model_fn``'s model as a pure function of its weights (`Parts`).

    Args:
      model_fn: Returns a `fedpersonal.models.from_keras_model` model (its global/local split), a plain Keras
        model (all its weights in the global groups), or, with `groups`, any model object.
      unroll_rnns: Whether recurrent layers run unrolled (needs a static number of time steps; lets a client
        step of an LSTM vectorize over clients). A fused LSTM runs unrolled only when a call falls back to Keras.
      fuse_lstms: Whether Keras LSTM layers with default arithmetic run as TensorFlow's fused `BlockLSTM` kernel
        (`fedpersonal.simulation.fused_lstm`: same results; one op per sequence instead of dozens per time step).
      groups: ``model -> (global_trainable, global_non_trainable, local_trainable, local_non_trainable)``
        variable lists of a model object that is neither a Keras model nor a `from_keras_model` model.
      batch_norm: Run BatchNormalization layers, recording their moving-statistic updates (see the module
        docstring); the caller must carry `stateful_slots` between steps. Otherwise they are refused.

    Attributes:
      initial_weights: The model's initial weights (`Parts` of numpy arrays): its seeded initializers' values.
      input_spec: The model's input spec (None for a Keras model or a model object without one).
      regularized: Whether the Keras parts have regularization losses.
      xla: Whether the engine compiles this model's client steps with XLA (``jit_compile``): not for recurrent or
        convolutional layers, which XLA's CPU backend ran 2.5-5x slower than TF's kernels (measured).
      vectorizes: Whether a client step with per-client weights vectorizes over clients (`tf.vectorized_map`): not
        for convolutions, whose per-client filters pfor cannot batch (their clients loop in the program instead).
      pfor_loops: Whether the model has fused LSTMs, which `tf.vectorized_map` runs client after client in a
        parallel loop inside a vectorized step (`fedpersonal.simulation.lockstep.for_each_client`).
      multiplies_matrices: Whether a client step multiplies matrices of weights: dense, convolutional or recurrent
        layers (not a model of embedding lookups and elementwise products, e.g. matrix factorization).
      stateful_slots: The slots of the weights the model's layers update in training mode (batch norm moving
        statistics), in a fixed order.
      template: The model object built once in a scratch graph (for its structure and attributes, e.g. sizes;
        its variables belong to that graph).

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

    A batch norm layer's moving statistics are recorded, its batch statistics taken over the real examples:

    >>> bn = FunctionalModel(lambda: tf.keras.Sequential([tf.keras.Input([1]), tf.keras.layers.BatchNormalization(
    ...     momentum=0.5)]), batch_norm=True)
    >>> bn.stateful_slots
    [(1, 0), (1, 1)]
    >>> x, mask = np.array([[1.0], [3.0], [100.0]], np.float32), np.array([1.0, 1.0, 0.0], np.float32)
    >>> _, _, updates = bn.apply(bn.initial_weights, x, example_mask=mask)
    >>> [float(updates[slot][0]) for slot in bn.stateful_slots]  # 0.5 * (0, 1) + 0.5 * (mean 2, variance 1)
    [1.0, 1.0]
    """

    def __init__(
        self,
        model_fn: ModelFn,
        *,
        unroll_rnns: bool = True,
        fuse_lstms: bool = True,
        groups: GroupsFn | None = None,
        batch_norm: bool = False,
    ):
        self.unroll_rnns = unroll_rnns
        self.fuse_lstms = fuse_lstms
        created: list[tf.Variable] = []

        def record(next_creator, **kwargs):
            variable = next_creator(**kwargs)
            created.append(variable)
            return variable

        with tf.Graph().as_default() as graph:
            with tf.variable_creator_scope(record):
                model = model_fn()
            self._is_keras = isinstance(model, tf.keras.Model)
            weight_groups = _weight_groups(model, groups)
            position = {id(v): (g, i) for g, variables in enumerate(weight_groups) for i, v in enumerate(variables)}
            self._batch_norm_slots = _batch_norm_slots(model, position, batch_norm)
            with tf.compat.v1.Session(graph=graph) as session:
                session.run(tf.compat.v1.variables_initializer(created))
                values = session.run([list(group) for group in weight_groups])
                created_values = session.run(created)
            self.regularized = any(part.losses for part in keras_parts(model))
            layers = [layer for part in keras_parts(model) for layer in [part, *part.submodules]]
            self.xla = not any(isinstance(layer, _NO_XLA_LAYERS) for layer in layers)
            self.vectorizes = not any(isinstance(layer, _CONV_LAYERS) for layer in layers)
            self.pfor_loops = fuse_lstms and any(fused_lstm.fusable(layer) for layer in layers)
            self.multiplies_matrices = any(isinstance(layer, _MATMUL_LAYERS) for layer in layers)
            self.input_spec = getattr(model, 'input_spec', None) if not self._is_keras else None
        self._model_fn = model_fn
        self.template = model
        self._position = position
        # For each created variable: its (group, index), or its initial value if it is in no group.
        self._sources: list[tuple[int, int] | np.ndarray] = [
            position.get(id(v), value) for v, value in zip(created, created_values)
        ]
        self.initial_weights = Parts(*[[np.asarray(v) for v in group] for group in values])
        self.stateful_slots = [slot for pair in self._batch_norm_slots for slot in pair]

    def slots_of(self, select: Callable[[Any], Sequence[Any]]) -> list[Slot]:
        """The slots of the variables ``select(model)`` returns (e.g. ``lambda m: m.variables_of('z')``)."""
        slots = []
        for variable in select(self.template):
            if id(variable) not in self._position:
                raise ValueError(f'{variable.name} is in none of the weight groups.')
            slots.append(self._position[id(variable)])
        return slots

    def rebuild(self, weights: Parts, *, example_mask: Any = None) -> Rebuilt:
        """The model object as a function of `weights` (call inside a `tf.function`).

        Args:
          weights: The model's weights (tensors or arrays).
          example_mask: Optional ``[batch]`` mask of the real examples of the inputs the model will see: batch
            norm layers compute their batch statistics over those only.
        """
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

        building = _no_updates_while_building() if self._batch_norm_slots else contextlib.nullcontext()
        with tf.variable_creator_scope(hand_out), partially_local_model.weights_as_tensors(), building:
            model = self._model_fn()
        updates: dict[Slot, tf.Tensor] = {}
        for layer, slots in zip(_batch_norms(model), self._batch_norm_slots):
            _record_moving_statistics(layer, slots, updates, example_mask)
        return Rebuilt(model, updates)

    def __call__(self, weights: Parts, x: Any, training: bool = True) -> tuple[Any, tf.Tensor]:
        """The predictions for inputs `x` and the regularization loss, as functions of `weights` (Keras models)."""
        predictions, regularization, _ = self.apply(weights, x, training)
        return predictions, regularization

    def apply(
        self, weights: Parts, x: Any, training: bool = True, *, example_mask: Any = None
    ) -> tuple[Any, tf.Tensor, dict[Slot, tf.Tensor]]:
        """``(predictions, regularization, updates)`` of the Keras model on `x` (see `rebuild`)."""
        if tf.executing_eagerly():  # Keras reads weight names while building, which eager tensors lack.
            return tf.function(self._apply, autograph=False)(weights, x, training, example_mask)
        return self._apply(weights, x, training, example_mask)

    def _apply(self, weights: Parts, x: Any, training: bool, example_mask: Any) -> tuple[Any, tf.Tensor, dict]:
        rebuilt = self.rebuild(weights, example_mask=example_mask)
        model = rebuilt.model
        keras_model = model if isinstance(model, tf.keras.Model) else partially_local_model.keras_model_of(model)
        if not isinstance(keras_model, tf.keras.Model):
            raise TypeError(f'{type(model).__name__} is not a Keras model: call rebuild() and its own methods.')
        rnns = [layer for layer in keras_model.submodules if isinstance(layer, tf.keras.layers.RNN)]
        for layer in rnns:
            if self.fuse_lstms and fused_lstm.fusable(layer):
                fused_lstm.fuse(layer)  # A call it cannot fuse (a mask, an initial state) runs the Keras layer.
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
        return predictions, (tf.add_n(losses) if losses else tf.constant(0.0)), rebuilt.updates


def _weight_groups(model: Any, groups: GroupsFn | None) -> tuple[Sequence[Any], ...]:
    if groups is not None:
        result = tuple(groups(model))
        if len(result) != 4:
            raise ValueError(f'groups must return 4 variable lists, got {len(result)}.')
        return result
    if isinstance(model, tf.keras.Model):  # A plain Keras model: every weight is global.
        return (model.trainable_weights, model.non_trainable_weights, [], [])
    if not isinstance(partially_local_model.keras_model_of(model), tf.keras.Model):
        raise partially_local_model.ModelSpecError(
            'The fast simulation engine needs a Keras model, or a model built with '
            'fedpersonal.models.from_keras_model (a Keras model as a pure function of its weights), or the '
            f"groups of its variables; got {type(model).__name__}. Use simulation='per_client' for other "
            'ReconstructionModel implementations.'
        )
    return (
        model.global_trainable_variables,
        model.global_non_trainable_variables,
        model.local_trainable_variables,
        model.local_non_trainable_variables,
    )


def _batch_norm_slots(model: Any, position: dict[int, Slot], allowed: bool) -> list[tuple[Slot, Slot]]:
    """Each batch norm layer's (moving mean, moving variance) slots; refuses what cannot be recorded."""
    layers = _batch_norms(model)
    if layers and not allowed:
        raise errors.ConfigError(
            f'The fast simulation engine cannot run layers that update their own weights while training '
            f"(BatchNormalization's moving statistics): {[layer.name for layer in layers]}. Use "
            "simulation='per_client' for this model."
        )
    slots = []
    for layer in layers:
        unsupported = [
            name
            for name, value in (
                ('renorm', layer.renorm),
                ('virtual_batch_size', layer.virtual_batch_size),
                ('adjustment', layer.adjustment),
                ('synchronized', getattr(layer, 'synchronized', False)),
            )
            if value
        ]
        if unsupported:
            raise errors.ConfigError(
                f'The fast simulation engine runs plain BatchNormalization only; {layer.name} uses {unsupported}. '
                "Use simulation='per_client' for this model."
            )
        pair = tuple(position.get(id(v)) for v in (layer.moving_mean, layer.moving_variance))
        if None in pair:
            raise errors.ConfigError(
                f"The moving statistics of {layer.name} are in none of the model's weight groups, so their updates "
                'could not be kept; put them in a (non-trainable) group.'
            )
        slots.append(pair)
    return slots  # type: ignore[return-value]


@contextlib.contextmanager
def _no_updates_while_building():
    """Batch norm layers called while a model is built (Keras' v1 layers, in TFF's graphs, update their moving
    statistics when the functional model is built on placeholders) return the new value instead of assigning it."""
    methods = {name: _BATCH_NORM.__dict__[name] for name in ('_assign_moving_average', '_assign_new_value')}
    _BATCH_NORM._assign_moving_average = lambda self, variable, value, momentum, inputs_size: variable
    _BATCH_NORM._assign_new_value = lambda self, variable, value: variable
    try:
        yield
    finally:
        for name, method in methods.items():
            setattr(_BATCH_NORM, name, method)


def _record_moving_statistics(layer: Any, slots: tuple[Slot, Slot], updates: dict, example_mask: Any) -> None:
    """Makes a rebuilt batch norm layer record its moving-statistic updates (and mask its batch moments).

    Keras' fused kernel (4D inputs) moves the variance towards the batch variance with Bessel's correction,
    ``n / (n - 1)`` for ``n`` values per channel, and its non-fused implementation towards the biased one; a
    layer built fused keeps its correction when the example mask switches it to the non-fused implementation.
    """
    names = {slots[0]: 'moving_mean', slots[1]: 'moving_variance'}
    bessel = bool(layer.fused) and example_mask is not None
    counts: dict[str, tf.Tensor] = {}  # The values per channel of the current call's batch moments.

    def record(variable, value):
        for slot, name in names.items():
            if variable is getattr(layer, name):
                object.__setattr__(layer, name, value)  # Later calls read it, as they would the assigned variable.
                updates[slot] = value
                return value
        raise errors.ConfigError(f'{layer.name} updates a weight the fast simulation engine does not track.')

    def assign_moving_average(variable, value, momentum, inputs_size):  # Keras' assign_sub, as a new value.
        value = tf.cast(value, variable.dtype)
        if bessel and variable is layer.moving_variance:
            n = tf.cast(counts['n'], variable.dtype)
            value = value * n / tf.maximum(n - 1.0, 1.0)
        decay = tf.cast(tf.convert_to_tensor(1.0 - momentum), variable.dtype)
        delta = (variable - value) * decay
        if inputs_size is not None:
            delta = tf.where(inputs_size > 0, delta, tf.zeros_like(delta))
        return record(variable, variable - delta)

    def assign_new_value(variable, value):
        return record(variable, tf.cast(value, variable.dtype))

    object.__setattr__(layer, '_assign_moving_average', assign_moving_average)
    object.__setattr__(layer, '_assign_new_value', assign_new_value)
    if example_mask is None:
        return

    def moments(inputs, reduction_axes, keep_dims, mask=None):
        if mask is not None:
            raise errors.ConfigError(f'{layer.name}: Keras masks are not supported with an example mask.')
        weights = tf.reshape(tf.cast(example_mask, inputs.dtype), [-1] + [1] * (inputs.shape.rank - 1))
        counts['n'] = tf.reduce_sum(weights + tf.zeros_like(inputs), axis=reduction_axes)
        return tf.nn.weighted_moments(inputs, reduction_axes, weights, keepdims=keep_dims)

    object.__setattr__(layer, 'fused', False)  # The fused kernel has no example weights.
    object.__setattr__(layer, '_moments', moments)
