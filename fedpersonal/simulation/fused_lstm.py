"""A Keras LSTM layer's arithmetic as TensorFlow's fused `BlockLSTM` kernel, for the engine's client steps.

The engine runs a client step of a recurrent model for a group of clients with per-client weights. Unrolled, a
Keras LSTM is a few dozen small ops per time step, forward and backward, batched over the clients by
`tf.vectorized_map`: on two cores one lockstep step of the NWP LSTM (10 clients, batch 16, 20 steps, 32 -> 64)
took 18 ms for its forward and backward passes, and 5 s to trace. `BlockLSTM` runs a whole sequence in one op
(and its gradient in one more); `pfor` has no converter for it, so `tf.vectorized_map` (with
``fallback_to_while_loop``) runs it client after client in a parallel `tf.while_loop` while the rest of the step
stays vectorized: 12.8 ms for the same work, 0.8 s to trace (`python benchmarks/fused_lstm.py`). Batching the
clients' sequences into one `BlockLSTM` call where the weights are shared (reconstruction steps) was tried
through a pfor converter: no faster, so not kept.

`BlockLSTM` computes ``[i, ci, f, o] = [x, h] @ w + b`` with sigmoid gates and tanh cell input and output, the
same arithmetic as a Keras LSTM with its default activations; only the order of the gates differs (Keras: i, f,
c, o), so the weights are reordered on the way in (differentiable slices). Results equal the Keras layer's to
float rounding. Layers with anything else (dropout, other activations, going backwards, statefulness) are not
fused, and a fused layer called with a mask or an initial state runs its Keras implementation.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def fusable(layer: Any) -> bool:
    """Whether `layer` is a Keras LSTM whose arithmetic `BlockLSTM` computes exactly (see the module docstring)."""
    if type(layer) is not tf.keras.layers.LSTM:  # pylint: disable=unidiomatic-typecheck
        return False
    cell = layer.cell
    return (
        cell.activation is tf.keras.activations.tanh
        and cell.recurrent_activation is tf.keras.activations.sigmoid
        and cell.use_bias
        and not cell.dropout
        and not cell.recurrent_dropout
        and not layer.go_backwards
        and not layer.stateful
        and not layer.time_major
    )


def _keras_to_block_order(matrix: tf.Tensor) -> tf.Tensor:
    """Gate columns (Keras: input, forget, cell, output) in `BlockLSTM`'s order (input, cell, forget, output)."""
    i, f, c, o = tf.split(matrix, 4, axis=-1)
    return tf.concat([i, c, f, o], axis=-1)


def fuse(layer: tf.keras.layers.LSTM) -> None:
    """Makes a fusable LSTM layer (`fusable`) run as `BlockLSTM` (a call with a mask or an initial state: Keras)."""
    cell, keras_call = layer.cell, layer.call

    def call(inputs, mask=None, training=None, initial_state=None):
        if mask is not None or initial_state is not None:
            return keras_call(inputs, mask=mask, training=training, initial_state=initial_state)
        inputs = tf.convert_to_tensor(inputs)
        time_major = tf.transpose(inputs, [1, 0, 2])
        zeros = tf.zeros(tf.stack([tf.shape(inputs)[0], cell.units]), inputs.dtype)
        no_peephole = tf.zeros([cell.units], inputs.dtype)
        outputs = tf.raw_ops.BlockLSTM(
            seq_len_max=tf.cast(tf.shape(time_major)[0], tf.int64),
            x=time_major,
            cs_prev=zeros,
            h_prev=zeros,
            w=_keras_to_block_order(tf.concat([cell.kernel, cell.recurrent_kernel], axis=0)),
            wci=no_peephole,
            wcf=no_peephole,
            wco=no_peephole,
            b=_keras_to_block_order(cell.bias),
            forget_bias=0.0,
            cell_clip=-1.0,
            use_peephole=False,
        )
        cs, h = outputs[1], outputs[6]  # [time, batch, units] each.
        output = tf.transpose(h, [1, 0, 2]) if layer.return_sequences else h[-1]
        return [output, h[-1], cs[-1]] if layer.return_state else output

    layer.call = call
