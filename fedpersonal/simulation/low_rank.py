"""A dense model's few plain SGD steps for a whole group as large products: the shared weights plus low-rank updates.

A plain SGD step of a dense layer from a batch of ``B`` examples changes its kernel by ``-lr * A^T D`` (the
batch's inputs ``A`` and the loss's gradients ``D`` with respect to the layer's outputs): a rank-``B`` update. So
after ``t`` steps a client's kernel is the shared starting kernel ``W`` plus the sum of its ``t`` rank-``B``
updates, and its next step's outputs are exactly

    a @ W_t = a @ W - lr * sum_s (a @ A_s^T) @ D_s,

one product with the *shared* ``W`` for every client of the group at once (``[clients x B, n_in] x [n_in,
n_out]``, a large matrix product that runs near the CPU's peak) plus small per-client corrections; the
gradients flow back through the same expression (``D @ W_t^T`` likewise). The clients' weights are never
materialized, and FedAvg's weighted sum of deltas is one more large product at the end, ``sum_c w_c lr A_c^T D_c``.
The client loop (`fedpersonal.simulation.client_loop`) instead runs each client's steps as products of ``B``
rows, which the CPU runs at a fraction of that rate (docs/ENGINE.md, "Dense rows").

It applies (`fits`) to a phase of plain SGD from shared starting weights whose trained weights are the kernels and
biases of Dense layers and whose other layers treat examples independently (activations, flatten, reshape, merges),
without regularization, penalty or per-client weights, returning only the weighted sum of the deltas (FedAvg's
globals), and only when the corrections cost little beside the products (few steps of small batches: their cost
grows with the square of the steps). Same results as the client loop to float rounding; a client whose update is
not finite is left out of the sum, as there.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from fedpersonal.models import partially_local_model
from fedpersonal.simulation import functional
from fedpersonal.simulation import lockstep

Slot = functional.Slot
DenseSlots = tuple[Slot, Slot | None]  # A Dense layer's (kernel, bias) slots.
# At most this many (padded) steps a phase: the steps are written out, each reading every earlier step's updates.
MAX_STEPS = 8
# The corrections' multiply-adds at most this share of the steps' products (forward, input and weight gradients).
MAX_CORRECTION_SHARE = 0.5
_ROW_WISE = (
    tf.keras.layers.InputLayer,
    tf.keras.layers.Dense,
    tf.keras.layers.Flatten,
    tf.keras.layers.Reshape,
    tf.keras.layers.Activation,
    tf.keras.layers.ReLU,
    tf.keras.layers.LeakyReLU,
    tf.keras.layers.ELU,
    tf.keras.layers.Softmax,
    tf.keras.layers.Add,
    tf.keras.layers.Subtract,
    tf.keras.layers.Multiply,
    tf.keras.layers.Average,
    tf.keras.layers.Maximum,
    tf.keras.layers.Minimum,
    tf.keras.layers.Concatenate,
)


def dense_layers(model: Any) -> list[DenseSlots] | None:
    """The ``(kernel, bias)`` slots of the Dense layers of a Keras functional (or Sequential) model whose layers all
    treat examples independently (`_ROW_WISE`), each called once on inputs of one vector per example, without
    regularization or batch norm; None for any other model."""
    if not isinstance(model, functional.FunctionalModel) or model.regularized or model.stateful_slots:
        return None
    keras_model = _keras_model(model.template)
    if keras_model is None:
        return None
    found = []
    for layer in _layers(keras_model):
        if isinstance(layer, tf.keras.Model):
            if not getattr(layer, '_is_graph_network', False):  # A subclassed model's call may mix examples.
                return None
        elif not isinstance(layer, _ROW_WISE) or 0 in _axes(layer):  # Axis 0 is the examples'.
            return None
        elif isinstance(layer, tf.keras.layers.Dense):
            shape = getattr(layer, 'input_shape', None)
            if len(layer.inbound_nodes) != 1 or not isinstance(shape, tuple) or len(shape) != 2:
                return None
            try:
                kernel = _slot(model, layer.kernel)
                bias = _slot(model, layer.bias) if layer.use_bias else None
            except ValueError:
                return None
            found.append((kernel, bias))
    return found


def fits(
    model: Any,
    weights: functional.Parts,
    train: Sequence[Slot],
    phase: Any,
    optimizer: Any,
    loss: Any,
    *,
    keep_trained: bool,
    delta_weights: Any = None,
    penalty: Any = None,
    centre: Sequence[Any] = (),
    client_loss: Any = None,
    step_inputs: Any = None,
    after_step: Any = None,
    zero_stats: Any = (),
    **_: Any,
) -> bool:
    """Whether `low_rank_steps` runs this phase (arguments as `client_loop.client_loop_steps`): see the module
    docstring; decided from the model, the arguments and the phase's static shapes, so always the same."""
    layers = dense_layers(model)
    if not layers or not train or keep_trained or delta_weights is None or loss is None:
        return False
    if any(x is not None for x in (penalty, client_loss, step_inputs, after_step)) or centre or zero_stats:
        return False
    if type(loss).__call__ is not tf.keras.losses.Loss.__call__ or lockstep.plain_sgd_learning_rate(optimizer) is None:
        return False
    base = model.initial_weights
    shared = all(not lockstep.is_per_client(weights[g][i], base[g][i]) for g in range(4) for i in range(len(base[g])))
    dense = {slot for pair in layers for slot in pair if slot is not None}
    if not shared or not set(train) <= dense:
        return False
    steps, batch = phase['mask'].shape[1:3]
    if steps is None or batch is None or steps > MAX_STEPS:
        return False
    products = corrections = 0
    for kernel, _bias in layers:
        n_in, n_out = base[kernel[0]][kernel[1]].shape
        products += 3 * steps * batch * n_in * n_out
        if kernel in train:
            corrections += batch * batch * steps * (steps - 1) * (n_in + n_out)
    return corrections <= MAX_CORRECTION_SHARE * products


@tf.autograph.experimental.do_not_convert
def low_rank_steps(
    model: functional.FunctionalModel,
    weights: functional.Parts,
    train: Sequence[Slot],
    phase: Any,
    optimizer: Any,
    loss: tf.keras.losses.Loss,
    *,
    delta_weights: tf.Tensor,
    metrics: Sequence[tf.keras.metrics.Metric] = (),
    **_: Any,
) -> tuple[functional.Parts, lockstep.GroupSteps]:
    """`client_loop.client_loop_steps` of a phase that `fits` (``keep_trained=False``; call inside a `tf.function`).

    Returns:
      ``(weights, GroupSteps)``: the weights as they went in, and per client its examples, loss sum and whether
      its update is finite (its inputs and output gradients of every dense layer), with ``weighted_deltas`` per
      trained slot: ``sum_c delta_weights[c] * (start - trained_c)`` over the finite clients.
    """
    layers = dense_layers(model) or []
    learning_rate = lockstep.plain_sgd_learning_rate(optimizer)
    mask = phase['mask']
    clients, steps, batch = tf.shape(mask)[0], mask.shape[1], mask.shape[2]
    x, y = partially_local_model.split_batch(phase['batch'])
    rebuilt = model.rebuild(weights).model
    keras_model = _keras_model(rebuilt)
    assert keras_model is not None  # As `dense_layers` found it.
    rebuilt_dense = [layer for layer in _layers(keras_model) if isinstance(layer, tf.keras.layers.Dense)]
    # Per dense layer: its inputs and output gradients at each step so far, [clients, batch, n] each.
    inputs: list[list[tf.Tensor]] = [[] for _ in layers]
    grads: list[list[tf.Tensor]] = [[] for _ in layers]
    outputs: list[tf.Tensor | None] = [None] * len(layers)
    step_inputs: list[tf.Tensor | None] = [None] * len(layers)
    trained_kernel = [kernel in train for kernel, _ in layers]
    trained_bias = [bias is not None and bias in train for _, bias in layers]

    def corrected(j: int, layer: tf.keras.layers.Dense, call: Any):
        def call_with_updates(values, *args, **kwargs):
            activation, layer.activation = layer.activation, None
            try:
                out = call(values, *args, **kwargs)
            finally:
                layer.activation = activation
            a = tf.reshape(values, [clients, batch, -1])
            z = tf.reshape(out, [clients, batch, -1])
            if grads[j]:
                earlier = tf.concat(grads[j], axis=1)
                if trained_kernel[j]:
                    z -= learning_rate * tf.matmul(tf.matmul(a, tf.concat(inputs[j], 1), transpose_b=True), earlier)
                if trained_bias[j]:
                    z -= learning_rate * tf.reduce_sum(earlier, axis=1, keepdims=True)
            tape.watch(z)  # The weights are tensors, not variables: the tape records from the outputs on.
            step_inputs[j], outputs[j] = a, z
            out = tf.reshape(z, tf.shape(out))
            return activation(out) if activation is not None else out

        return call_with_updates

    for j, layer in enumerate(rebuilt_dense):
        layer.call = corrected(j, layer, layer.call)
    flat = lambda a: tf.reshape(a, tf.concat([[clients * batch], tf.shape(a)[2:]], 0))
    num_examples = loss_sum = tf.zeros([clients])
    for t in range(steps):
        tape = tf.GradientTape()
        labels = tf.nest.map_structure(lambda a, t=t: a[:, t], y)
        step_mask = mask[:, t]
        n = tf.reduce_sum(step_mask, axis=1)
        with tape:
            predictions = keras_model(tf.nest.map_structure(lambda a, t=t: flat(a[:, t]), x), training=True)
            predictions = tf.nest.map_structure(functools.partial(_per_client, clients, batch), predictions)
            batch_loss = _client_losses(loss, labels, predictions, step_mask)
            total = tf.reduce_sum(batch_loss * tf.cast(n > 0, batch_loss.dtype))
        gradients = tape.gradient(total, outputs, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        for j, gradient in enumerate(gradients):
            inputs[j].append(step_inputs[j])
            grads[j].append(gradient)
        num_examples += n
        loss_sum += batch_loss * n
        if metrics:
            lockstep.update_metrics(metrics, labels, predictions, step_mask, loss, batch_loss)
    learning_rate = tf.cast(learning_rate, tf.float32)

    def weighted_deltas(finite: tf.Tensor | None) -> list[tf.Tensor]:
        """The weighted sums of the deltas of the `finite` clients (all with None)."""
        weight = tf.reshape(delta_weights if finite is None else tf.where(finite, delta_weights, 0.0), [-1, 1])
        rows = lambda values: (
            tf.concat(values, 1) if finite is None else tf.where(finite[:, None, None], tf.concat(values, 1), 0.0)
        )
        deltas: dict[Slot, tf.Tensor] = {}
        for (kernel, bias), a, d, k, b in zip(layers, inputs, grads, trained_kernel, trained_bias):
            weighted = tf.reshape(rows(d), [clients, -1]) * weight  # [clients, steps x batch x n_out]
            weighted = tf.reshape(weighted, [-1, d[0].shape[-1]])
            if k:
                a_rows = tf.reshape(rows(a), [-1, a[0].shape[-1]])
                deltas[kernel] = learning_rate * tf.matmul(a_rows, weighted, transpose_a=True)
            if b and bias is not None:
                deltas[bias] = learning_rate * tf.reduce_sum(weighted, axis=0)
        return [deltas[s] for s in train]

    def client_finite() -> tf.Tensor:
        """Per client: its inputs and output gradients of every dense layer are finite, as its update then is."""
        return tf.reduce_all([_finite(tf.concat(values, 1)) for values in inputs + grads], axis=0)

    # A client's update is finite iff its rows are (a non-finite entry of A or D spreads through A^T D), so the sum
    # of all is finite iff every client's is (float overflow of finite rows aside): the clients are checked one by
    # one, and the sum taken again without the others, only when it is not.
    deltas = weighted_deltas(None)
    all_finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(d)) for d in deltas])
    finite = tf.cond(all_finite, lambda: tf.ones([clients], tf.bool), client_finite)
    deltas = tf.cond(all_finite, lambda: deltas, lambda: weighted_deltas(finite))
    return weights, lockstep.GroupSteps(num_examples, loss_sum, deltas, finite)


def _per_client(clients: tf.Tensor, batch: int, predictions: tf.Tensor) -> tf.Tensor:
    """``[clients x batch, ...]`` predictions as ``[clients, batch, ...]``, keeping the logits Keras attaches to a
    softmax's or sigmoid's output, from which its cross-entropy losses are computed (exactly, unclipped)."""
    shaped = tf.reshape(predictions, tf.concat([[clients, batch], tf.shape(predictions)[1:]], 0))
    logits = getattr(predictions, '_keras_logits', None)
    if logits is not None:
        shaped._keras_logits = tf.reshape(logits, tf.shape(shaped))  # pylint: disable=protected-access
    return shaped


def _axes(layer: Any) -> list[int]:
    """The axes a concatenation or softmax layer works along (none for other layers)."""
    axis = (
        getattr(layer, 'axis', None)
        if isinstance(layer, (tf.keras.layers.Concatenate, tf.keras.layers.Softmax))
        else None
    )
    return [] if axis is None else list(axis) if isinstance(axis, (list, tuple)) else [axis]


def _slot(model: functional.FunctionalModel, variable: Any) -> Slot:
    return model.slots_of(lambda _: [variable])[0]


def _client_losses(loss: tf.keras.losses.Loss, labels: Any, predictions: Any, mask: tf.Tensor) -> tf.Tensor:
    """Each client's batch loss ``[clients]`` over its real examples, as `lockstep.masked_loss` reduces one."""
    if loss.reduction != tf.keras.losses.Reduction.SUM:
        return lockstep.batch_mean_loss(loss, labels, predictions, mask)
    values = loss.call(labels, predictions)
    weights = tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([values.shape.rank - 2], tf.int32)], 0))
    return tf.reduce_sum(values * weights, axis=list(range(1, values.shape.rank)))


def _finite(values: tf.Tensor) -> tf.Tensor:
    return tf.reduce_all(tf.math.is_finite(values), axis=[1, 2])


def _keras_model(model: Any) -> tf.keras.Model | None:
    keras_model = model if isinstance(model, tf.keras.Model) else partially_local_model.keras_model_of(model)
    return keras_model if isinstance(keras_model, tf.keras.Model) else None


def _layers(keras_model: tf.keras.Model) -> list[Any]:
    """The model and its layers, nested models' layers included, each once, in the order the model lists them (the
    same for every build of one model function)."""
    found: list[Any] = []

    def visit(layer: Any) -> None:
        if all(layer is not f for f in found):
            found.append(layer)
            for inner in getattr(layer, 'layers', []) if isinstance(layer, tf.keras.Model) else []:
                visit(inner)

    visit(keras_model)
    return found
