"""The plug-in Keras interface: a Keras model split into global and local parts.

`from_keras_model` wraps a built, uncompiled `tf.keras.Model` plus a declaration
of which layers (or variables) are *global* (trained federatedly, aggregated on
the server) and which are *local* (never leave the client) into a
`PartiallyLocalModel`. The result is a `tff.learning.models.ReconstructionModel`,
so it works with every algorithm in `fedpersonal.algorithms` and with TFF's own
`tff.learning.algorithms.build_fed_recon`.

Every structural mistake is reported when the model is wrapped, with the
offending layer or variable named: compiled or unbuilt models, layers that are
not part of the model, variables declared both global and local, variables
declared neither, an input spec the model cannot consume, and a model lacking a
global or local part that an algorithm requires.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import TypeAlias

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

ReconstructionModel: TypeAlias = tff.learning.models.ReconstructionModel
ReconstructionBatchOutput: TypeAlias = tff.learning.models.reconstruction_model.ReconstructionBatchOutput
ModelFn: TypeAlias = Callable[[], ReconstructionModel]


def initializer_seed(seed: int, index: int) -> int:
    """The op-level seed of a model's `index`-th random initializer when the model is built with `seed`.

    ``(seed * 1024 + index) mod 2**31``: distinct for every variable of a model (``0 <= index < 1024``) and, for
    ``0 <= seed < 2**21``, across the models of different seeds (``seed + index`` would give seed 0's second
    variable the values of seed 1's first). For seed 0 the seeds are just ``0, 1, 2, ...``. Keras' seeded
    initializers draw with stateless random ops, so a variable's initial value depends only on this seed, its
    shape and its initializer: a model built twice (eagerly, or inside a TFF computation's fresh graph, with or
    without a graph-level seed) starts from bit-identical weights.
    """
    return (int(seed) * 1024 + int(index)) % 2**31


_WEIGHTS_AS_TENSORS: contextvars.ContextVar[bool] = contextvars.ContextVar('weights_as_tensors', default=False)


@contextlib.contextmanager
def weights_as_tensors():
    """While active, `from_keras_model` only wraps: its weights may be tensors (see `fedpersonal.simulation.functional`).

    A model function called inside a `tf.variable_creator_scope` that hands out tensors instead of variables
    builds a Keras model that is a pure function of those tensors; the global/local declaration was already
    validated when the model was first built, and tensors have no `trainable` to partition by.
    """
    token = _WEIGHTS_AS_TENSORS.set(True)
    try:
        yield
    finally:
        _WEIGHTS_AS_TENSORS.reset(token)


def keras_model_of(model: Any) -> Any:
    """The Keras model a `ReconstructionModel` wraps, or None: `from_keras_model`'s ``keras_model``, or the one of
    TFF's `ReconstructionModel.from_keras_model_and_layers` (which predicts ``keras_model(batch['x'])`` too)."""
    keras_model = getattr(model, 'keras_model', None)
    if keras_model is None and type(model).__name__ == '_KerasReconstructionModel':
        keras_model = getattr(model, '_keras_model', None)
    return keras_model


class ModelSpecError(ValueError):
    """A model, its global/local declaration or its input spec is inconsistent."""


def _var_names(variables: Iterable[tf.Variable]) -> list[str]:
    return [v.name for v in variables]


def _unique(variables: Iterable[tf.Variable]) -> list[tf.Variable]:
    seen, out = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


class PartiallyLocalModel(ReconstructionModel):
    """A Keras model whose variables are partitioned into global and local sets.

    Use `from_keras_model` to build one; the constructor assumes validated input.
    """

    def __init__(
        self,
        keras_model: tf.keras.Model,
        *,
        global_trainable_variables: Sequence[tf.Variable],
        global_non_trainable_variables: Sequence[tf.Variable],
        local_trainable_variables: Sequence[tf.Variable],
        local_non_trainable_variables: Sequence[tf.Variable],
        input_spec: Any,
    ):
        self._keras_model = keras_model
        self._global_trainable = list(global_trainable_variables)
        self._global_non_trainable = list(global_non_trainable_variables)
        self._local_trainable = list(local_trainable_variables)
        self._local_non_trainable = list(local_non_trainable_variables)
        self._input_spec = input_spec

    @property
    def keras_model(self) -> tf.keras.Model:
        """The wrapped Keras model (shares its variables with this model)."""
        return self._keras_model

    @property
    def global_trainable_variables(self) -> list[tf.Variable]:
        return list(self._global_trainable)

    @property
    def global_non_trainable_variables(self) -> list[tf.Variable]:
        return list(self._global_non_trainable)

    @property
    def local_trainable_variables(self) -> list[tf.Variable]:
        return list(self._local_trainable)

    @property
    def local_non_trainable_variables(self) -> list[tf.Variable]:
        return list(self._local_non_trainable)

    @property
    def input_spec(self) -> Any:
        return self._input_spec

    def predict_on_batch(self, x: Any, training: bool = False) -> tf.Tensor:
        """Predictions for the model inputs `x` (no labels)."""
        return self._keras_model(x, training=training)

    @tf.function
    def forward_pass(self, batch_input: Any, training: bool = True) -> ReconstructionBatchOutput:
        x, y = split_batch(batch_input)
        predictions = self._keras_model(x, training=training)
        num_examples = tf.shape(tf.nest.flatten(x)[0])[0]
        return ReconstructionBatchOutput(predictions=predictions, labels=y, num_examples=num_examples)


def split_batch(batch: Any) -> tuple[Any, Any]:
    """A batch's ``(x, y)``: the `"x"`/`"y"` entries of a mapping, or the two items of a pair."""
    if isinstance(batch, Mapping):
        return batch['x'], batch['y']
    return batch[0], batch[1]


def _check_input_spec(keras_model: tf.keras.Model, input_spec: Any) -> None:
    """Raises `ModelSpecError` unless `input_spec` is (x, y) the model accepts."""
    if isinstance(input_spec, Mapping):
        missing = [k for k in ('x', 'y') if k not in input_spec]
        if missing or len(input_spec) != 2:
            raise ModelSpecError(
                'input_spec must be a mapping with exactly the keys "x" (model input) and "y" '
                f'(label); got keys {list(input_spec.keys())}.'
            )
        x_spec = input_spec['x']
    elif isinstance(input_spec, Sequence) and len(input_spec) == 2:
        x_spec = input_spec[0]
    else:
        raise ModelSpecError(
            'input_spec must be an (x, y) pair or a mapping {"x": ..., "y": ...} of tf.TensorSpec; '
            f'got {input_spec!r}.'
        )
    for leaf in tf.nest.flatten(input_spec):
        if not isinstance(leaf, tf.TensorSpec):
            raise ModelSpecError(f'input_spec leaves must be tf.TensorSpec; got {leaf!r}.')
    model_inputs = getattr(keras_model, 'inputs', None)
    if not model_inputs:
        return  # Subclassed model: compatibility is checked by calling it below.
    x_leaves = tf.nest.flatten(x_spec)
    if len(x_leaves) != len(model_inputs):
        raise ModelSpecError(
            f'input_spec["x"] has {len(x_leaves)} tensor(s) but the Keras model has '
            f'{len(model_inputs)} input(s) ({[i.name for i in model_inputs]}).'
        )
    for spec, model_input in zip(x_leaves, model_inputs):
        if spec.dtype != model_input.dtype:
            raise ModelSpecError(
                f'input_spec x tensor {spec} has dtype {spec.dtype.name} but Keras input '
                f'"{model_input.name}" expects {model_input.dtype.name}.'
            )
        if not spec.shape.is_compatible_with(model_input.shape):
            raise ModelSpecError(
                f'input_spec x tensor has shape {spec.shape} but Keras input "{model_input.name}" '
                f'expects {model_input.shape}.'
            )


def _declared(items: Any, argument: str, keras_model: tf.keras.Model) -> list[Any]:
    """The layers (``*_layers``) or variables (``*_variables``) of a declaration; names are looked up in the model.

    Raises:
      TypeError: `items` is not a list (e.g. one layer or variable alone), or holds something else.
      ModelSpecError: a name that no layer / variable of the model has (the message lists the names it has).
    """
    if items is None:
        return []
    want_layers = argument.endswith('_layers')
    kind, cls = ('layer', tf.keras.layers.Layer) if want_layers else ('variable', tf.Variable)
    if isinstance(items, (str, bytes, Mapping, tf.keras.layers.Layer, tf.Variable, tf.Tensor)) or not isinstance(
        items, Iterable
    ):
        raise TypeError(f'{argument} must be a list of {kind}s (or {kind} names), got {type(items).__name__}.')
    out = []
    for item in items:
        if isinstance(item, str):
            if want_layers:
                candidates = [layer for layer in keras_model.submodules if getattr(layer, 'name', None) == item]
                known = sorted({layer.name for layer in keras_model.layers})
            else:
                candidates = [v for v in keras_model.variables if item in (v.name, v.name.split(':')[0])]
                known = [v.name for v in keras_model.variables]
            if len(candidates) != 1:
                problem = 'no' if not candidates else f'{len(candidates)}'
                raise ModelSpecError(
                    f'{argument}: {problem} {kind} named {item!r} in Keras model "{keras_model.name}" '
                    f'(its {kind}s: {known}).'
                )
            item = candidates[0]
        elif not isinstance(item, cls):
            raise TypeError(
                f'{argument} must hold {kind}s (tf.keras.layers.Layer / tf.Variable) or their names, '
                f'got {type(item).__name__} {item!r:.80}.'
            )
        out.append(item)
    return out


class FnArgumentError(TypeError):
    """A `loss_fn` / `metrics_fn` argument of the wrong kind (e.g. a loss instance, a metrics list).

    Raised while a client computation is traced; `ag_pass_through` keeps AutoGraph from burying the message under
    an "in user code:" trace.
    """

    ag_pass_through = True


def check_loss_and_metrics_fns(loss_fn: Any, metrics_fn: Any) -> tuple[tf.keras.losses.Loss, list[Any]]:
    """Calls `loss_fn` and `metrics_fn` and checks what they return; returns (loss, metrics list).

    Call where the loss and metrics are created (inside `tf.init_scope` while tracing).

    Raises:
      FnArgumentError: (a TypeError) naming the argument: `loss_fn` is a loss instance, a string or not callable, or does not return a
        `tf.keras.losses.Loss`; `metrics_fn` is a list or a metric instead of a no-arg function, or does not return
        a list of `tf.keras.metrics.Metric`.
    """
    if isinstance(loss_fn, tf.keras.losses.Loss):
        raise FnArgumentError(
            f'loss_fn must be a no-arg function returning a new tf.keras.losses.Loss, got the instance {loss_fn!r}; '
            f'pass its class (e.g. loss_fn=tf.keras.losses.MeanSquaredError) or a lambda returning it.'
        )
    if not callable(loss_fn):
        raise FnArgumentError(
            f'loss_fn must be a no-arg function returning a tf.keras.losses.Loss (e.g. '
            f'tf.keras.losses.MeanSquaredError), got {type(loss_fn).__name__} {loss_fn!r:.80}.'
        )
    try:
        loss = loss_fn()
    except TypeError as e:
        raise FnArgumentError(f'loss_fn must be callable with no arguments; calling loss_fn() failed: {e}') from None
    if not isinstance(loss, tf.keras.losses.Loss):
        raise FnArgumentError(f'loss_fn() must return a tf.keras.losses.Loss, got {type(loss).__name__} {loss!r:.80}.')
    if metrics_fn is None:
        return loss, []
    if isinstance(metrics_fn, (tf.keras.metrics.Metric, Sequence)):
        raise FnArgumentError(
            f'metrics_fn must be a no-arg function returning a list of Keras metrics, got a {type(metrics_fn).__name__}'
            f'; pass metrics_fn=lambda: [...] so each client builds fresh metrics.'
        )
    if not callable(metrics_fn):
        raise FnArgumentError(f'metrics_fn must be None or a no-arg function, got {type(metrics_fn).__name__}.')
    try:
        metrics = metrics_fn()
    except TypeError as e:
        raise FnArgumentError(
            f'metrics_fn must be callable with no arguments; calling metrics_fn() failed: {e}'
        ) from None
    if isinstance(metrics, tf.keras.metrics.Metric) or not isinstance(metrics, Sequence) or isinstance(metrics, str):
        raise FnArgumentError(
            f'metrics_fn() must return a list of tf.keras.metrics.Metric, got {type(metrics).__name__}.'
        )
    for index, metric in enumerate(metrics):
        if not isinstance(metric, tf.keras.metrics.Metric):
            raise FnArgumentError(
                f'metrics_fn() must return a list of tf.keras.metrics.Metric; item {index} is '
                f'{type(metric).__name__} {metric!r:.80}.'
            )
    return loss, list(metrics)


def from_keras_model(
    keras_model: tf.keras.Model,
    *,
    input_spec: Any,
    global_layers: Iterable[tf.keras.layers.Layer] | None = None,
    local_layers: Iterable[tf.keras.layers.Layer] | None = None,
    global_variables: Iterable[tf.Variable] | None = None,
    local_variables: Iterable[tf.Variable] | None = None,
) -> PartiallyLocalModel:
    """Wraps a Keras model and a global/local declaration into a partially local model.

    Declare the split either by layers (`global_layers`/`local_layers`) or by
    variables (`global_variables`/`local_variables`), or both (the union is
    used). Every variable of the model must be declared exactly once. Trainable
    and non-trainable variables are told apart by the variables themselves.

    Args:
      keras_model: A built, uncompiled `tf.keras.Model`.
      input_spec: `{"x": <spec of model input>, "y": <spec of label>}` (or an
        `(x, y)` pair) of `tf.TensorSpec` with a leading batch dimension.
      global_layers: Layers (or layer names) whose variables are global (aggregated on the server).
      local_layers: Layers (or layer names) whose variables are local (never leave the client).
      global_variables: Additional global variables (or variable names, with or without ``:0``).
      local_variables: Additional local variables (or names).

    Returns:
      A `PartiallyLocalModel` (a `tff.learning.models.ReconstructionModel`).

    Raises:
      TypeError: `keras_model` is not a `tf.keras.Model`; a declaration is not a
        list of layers / variables (or names).
      ModelSpecError: the model is compiled or unbuilt; a declared layer is not
        part of the model, or a declared name is not in it; a variable is declared both global and local, or
        neither; the input spec does not fit the model.
    """
    if not isinstance(keras_model, tf.keras.Model):
        raise TypeError(f'keras_model must be a tf.keras.Model, got {type(keras_model).__name__}.')
    if _WEIGHTS_AS_TENSORS.get():
        return PartiallyLocalModel(
            keras_model,
            global_trainable_variables=[],
            global_non_trainable_variables=[],
            local_trainable_variables=[],
            local_non_trainable_variables=[],
            input_spec=input_spec,
        )
    if getattr(keras_model, 'compiled_loss', None) is not None or getattr(keras_model, '_is_compiled', False):
        raise ModelSpecError(
            f'Keras model "{keras_model.name}" is compiled. Pass an uncompiled model: losses, '
            'metrics and optimizers are given to the algorithm builders instead.'
        )
    if not keras_model.built:
        raise ModelSpecError(
            f'Keras model "{keras_model.name}" is not built, so it has no variables to partition. '
            'Build it first (functional API with tf.keras.Input, or call model.build(input_shape)).'
        )
    _check_input_spec(keras_model, input_spec)

    model_layers = {id(layer) for layer in keras_model.submodules if isinstance(layer, tf.keras.layers.Layer)}
    model_layers.add(id(keras_model))

    def collect(layers, variables, role):
        out = []
        for layer in _declared(layers, f'{role.lower()}_layers', keras_model):
            if id(layer) not in model_layers:
                raise ModelSpecError(
                    f'{role} layer "{getattr(layer, "name", layer)}" is not part of Keras model "{keras_model.name}".'
                )
            out.extend(layer.variables)
        out.extend(_declared(variables, f'{role.lower()}_variables', keras_model))
        return _unique(out)

    global_vars = collect(global_layers, global_variables, 'Global')
    local_vars = collect(local_layers, local_variables, 'Local')

    model_var_ids = {id(v) for v in keras_model.variables}
    for role, group in (('Global', global_vars), ('Local', local_vars)):
        foreign = [v.name for v in group if id(v) not in model_var_ids]
        if foreign:
            raise ModelSpecError(f'{role} variables {foreign} are not variables of Keras model "{keras_model.name}".')
    overlap = [v.name for v in global_vars if id(v) in {id(u) for u in local_vars}]
    if overlap:
        raise ModelSpecError(f'Variables declared both global and local: {overlap}.')
    declared = {id(v) for v in global_vars + local_vars}
    missing = [v.name for v in keras_model.variables if id(v) not in declared]
    if missing:
        raise ModelSpecError(
            f'Variables of Keras model "{keras_model.name}" declared neither global nor local: '
            f'{missing}. Every variable must be assigned to exactly one part.'
        )
    return PartiallyLocalModel(
        keras_model,
        global_trainable_variables=[v for v in global_vars if v.trainable],
        global_non_trainable_variables=[v for v in global_vars if not v.trainable],
        local_trainable_variables=[v for v in local_vars if v.trainable],
        local_non_trainable_variables=[v for v in local_vars if not v.trainable],
        input_spec=input_spec,
    )


def require_parts(
    model: ReconstructionModel, *, algorithm: str, needs_global: bool = True, needs_local: bool = False
) -> None:
    """Raises `ModelSpecError` if `model` lacks a part `algorithm` requires.

    Args:
      model: The model an algorithm is being built for.
      algorithm: Name used in the error message.
      needs_global: Require at least one global trainable variable.
      needs_local: Require at least one local trainable variable.
    """
    if needs_global and not model.global_trainable_variables:
        raise ModelSpecError(
            f'{algorithm} needs a model with global trainable variables; this model has none '
            f'(local trainable: {_var_names(model.local_trainable_variables)}).'
        )
    if needs_local and not model.local_trainable_variables:
        raise ModelSpecError(
            f'{algorithm} needs a model with local trainable variables; this model has none '
            f'(global trainable: {_var_names(model.global_trainable_variables)}).'
        )


class DatasetSpecError(TypeError):
    """A client dataset's elements do not match the model's input spec."""


def check_dataset_matches(input_spec: Any, dataset: tf.data.Dataset, *, client_id: str | None = None) -> None:
    """Raises `DatasetSpecError` naming the client and field if `dataset` does not fit `input_spec`.

    Args:
      input_spec: The model's `input_spec`.
      dataset: A batched client dataset.
      client_id: Included in the error message when given.
    """
    where = f'client {client_id!r}: ' if client_id is not None else ''
    element_spec = dataset.element_spec
    if isinstance(input_spec, Mapping):
        if not isinstance(element_spec, Mapping):
            raise DatasetSpecError(
                f'{where}dataset elements are {element_spec!r}; the model expects a mapping with keys '
                f'{sorted(input_spec)}.'
            )
        missing = sorted(set(input_spec) - set(element_spec))
        extra = sorted(set(element_spec) - set(input_spec))
        if missing or extra:
            raise DatasetSpecError(
                f'{where}dataset element keys {sorted(element_spec)} do not match the model input spec keys '
                f'{sorted(input_spec)} (missing: {missing}, unexpected: {extra}).'
            )
    try:
        tf.nest.assert_same_structure(input_spec, element_spec, check_types=False)
    except (ValueError, TypeError) as e:
        raise DatasetSpecError(f'{where}dataset element structure does not match the model input spec: {e}') from None
    flat_paths = nest.flatten_with_joined_string_paths(input_spec)
    for (path, expected), got in zip(flat_paths, tf.nest.flatten(element_spec)):
        if expected.dtype != got.dtype:
            raise DatasetSpecError(
                f'{where}field "{path}" has dtype {got.dtype.name}, the model expects {expected.dtype.name}.'
            )
        if not expected.shape.is_compatible_with(got.shape):
            raise DatasetSpecError(
                f'{where}field "{path}" has shape {got.shape}, the model expects {expected.shape} '
                '(is the dataset batched?).'
            )
