"""Communication accounting measured on the values a learning process actually moves.

* `build_measured_broadcast(value_type)`: a `DistributionProcess` that
  broadcasts the server's model weights and, on every client, measures what it
  received (number of scalars and bytes of every tensor, by dtype);
* `MeasuredAggregationFactory(inner)`: wraps any `tff.aggregators` factory; on
  every client it measures the value handed to the aggregator (the model
  update) and the aggregation weight, then delegates to `inner`.

Both report per-client means (`*_per_client`) and the cohort size in their
`measurements`, so `process.next(...).metrics['distributor' | 'aggregator']`
carries them each round. The sizes are computed inside the client TF
computations from the tensors themselves, so whatever the process sends
(global variables only for FedRecon, everything for FedAvg/FedYogi, learned
local defaults when enabled) is what is counted, not a formula over the model.
Plug them into `fedpersonal.algorithms.build_fed_recon(model_distributor=...,
model_aggregator=...)` or TFF's `build_weighted_fed_avg(model_distributor=...,
model_aggregator=...)`.

Protocol overhead (serialization, secure-aggregation expansion) is not modelled:
these are payload sizes.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def _payload_computation(value_type: tff.Type) -> tff.Computation:
    """`value -> <scalars, bytes>` (float64) for one client's copy of `value`."""

    @tff.tensorflow.computation(value_type)
    def payload(value):
        scalars = tf.constant(0, tf.int64)
        num_bytes = tf.constant(0, tf.int64)
        leaves = tff.structure.flatten(value) if isinstance(value, tff.structure.Struct) else tf.nest.flatten(value)
        for tensor in leaves:
            size = tf.size(tensor, out_type=tf.int64)
            itemsize = 1 if tensor.dtype == tf.string else tensor.dtype.size
            if tensor.dtype == tf.string:
                size = tf.reduce_sum(tf.strings.length(tf.reshape(tensor, [-1]), unit='BYTE', name='string_bytes'))
                size = tf.cast(size, tf.int64)
                scalars += tf.size(tensor, out_type=tf.int64)
            else:
                scalars += size
            num_bytes += size * itemsize
        return collections.OrderedDict(scalars=tf.cast(scalars, tf.float64), bytes=tf.cast(num_bytes, tf.float64))

    return payload


def _mean_over_clients(payloads, prefix: str, suffix: str) -> collections.OrderedDict:
    mean = tff.federated_mean(payloads)
    return collections.OrderedDict(
        [
            (f'{prefix}scalars{suffix}', mean.scalars),
            (f'{prefix}bytes{suffix}', mean.bytes),
        ]
    )


def build_measured_broadcast(value_type: tff.Type) -> tff.learning.templates.DistributionProcess:
    """Broadcast distributor reporting `scalars_down_per_client`, `bytes_down_per_client`, `clients`.

    Args:
      value_type: The server value's type (e.g. the learning process' model weights type).
    """
    payload = _payload_computation(value_type)

    @tff.federated_computation
    def initialize():
        return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(tff.FederatedType((), tff.SERVER), tff.FederatedType(value_type, tff.SERVER))
    def next_fn(state, value):
        client_value = tff.federated_broadcast(value)
        measured = _mean_over_clients(tff.federated_map(payload, client_value), '', '_down_per_client')
        measured['clients'] = tff.federated_sum(tff.federated_value(1, tff.CLIENTS))
        return tff.templates.MeasuredProcessOutput(
            state=state, result=client_value, measurements=tff.federated_zip(measured)
        )

    return tff.learning.templates.DistributionProcess(initialize, next_fn)


class MeasuredAggregationFactory(tff.aggregators.WeightedAggregationFactory):
    """Measures each client's upload (`scalars_up_per_client`, `bytes_up_per_client`), then runs `inner`.

    The upload is the aggregated value (the model update) plus its aggregation
    weight (not counted when `inner` is unweighted: it never reads it). `inner`'s own measurements are kept under `inner`.

    Args:
      inner: Any weighted or unweighted aggregation factory (default: weighted `MeanFactory`).
    """

    def __init__(
        self,
        inner: tff.aggregators.WeightedAggregationFactory | tff.aggregators.UnweightedAggregationFactory | None = None,
    ):
        if inner is None:
            inner = tff.aggregators.MeanFactory()
        if isinstance(inner, tff.aggregators.UnweightedAggregationFactory):
            self._weighted = False
        elif isinstance(inner, tff.aggregators.WeightedAggregationFactory):
            self._weighted = True
        else:
            raise TypeError(f'inner must be a tff.aggregators factory, got {type(inner)}.')
        self._inner = inner

    def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
        inner = self._inner.create(value_type, weight_type) if self._weighted else self._inner.create(value_type)
        # An unweighted inner aggregator never reads the weight, so a client would not send it.
        upload_type = (
            tff.StructType([('update', value_type), ('weight', weight_type)])
            if self._weighted
            else tff.StructType([('update', value_type)])
        )
        payload = _payload_computation(upload_type)

        @tff.tensorflow.computation(value_type, weight_type)
        def pair(value, weight):
            if self._weighted:
                return collections.OrderedDict(update=value, weight=weight)
            return collections.OrderedDict(update=value)

        @tff.federated_computation(
            inner.initialize.type_signature.result,
            tff.FederatedType(value_type, tff.CLIENTS),
            tff.FederatedType(weight_type, tff.CLIENTS),
        )
        def next_fn(state, value, weight):
            uploads = tff.federated_map(pair, (value, weight))
            measured = _mean_over_clients(tff.federated_map(payload, uploads), '', '_up_per_client')
            output = inner.next(state, value, weight) if self._weighted else inner.next(state, value)
            measured['inner'] = output.measurements
            return tff.templates.MeasuredProcessOutput(
                state=output.state, result=output.result, measurements=tff.federated_zip(measured)
            )

        return tff.templates.AggregationProcess(inner.initialize, next_fn)


def communication_from_metrics(metrics) -> dict[str, float]:
    """Pulls the measured communication out of a learning process' round metrics (`{}` if none)."""
    out = {}
    for part in ('distributor', 'aggregator'):
        values = metrics.get(part, {}) if hasattr(metrics, 'get') else {}
        for key in (
            'scalars_down_per_client',
            'bytes_down_per_client',
            'scalars_up_per_client',
            'bytes_up_per_client',
            'clients',
        ):
            if key in values:
                out[key] = float(np.asarray(values[key]))
    return out
