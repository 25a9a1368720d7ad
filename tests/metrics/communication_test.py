"""Communication accounting: measured payloads equal the variables each process really moves."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal.algorithms import fed_recon
from fedpersonal.data import text_pipeline as tp
from fedpersonal.metrics import communication
from fedpersonal.models import next_word_prediction as nwp

LAYOUT = tp.TokenLayout(vocab_size=20, num_oov_buckets=11)
DIM, UNITS, LENGTH = 4, 6, 5


def _datasets(num_clients=3):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(num_clients):
        x = rng.integers(1, LAYOUT.num_classes, size=[8, LENGTH])
        out.append(tf.data.Dataset.from_tensor_slices({'x': x, 'y': np.roll(x, -1, axis=1)}).batch(4))
    return out


def _count(shapes):
    return int(sum(np.prod(s) for s in shapes))


def _variable_counts():
    model = nwp.model_fn(LAYOUT, max_sequence_length=LENGTH, embedding_dim=DIM, lstm_units=UNITS)()
    global_count = _count([v.shape for v in model.global_trainable_variables])
    local_count = _count([v.shape for v in model.local_trainable_variables])
    return global_count, local_count


def test_fed_recon_sends_only_global_variables_and_fedavg_sends_everything():
    model_fn = nwp.model_fn(LAYOUT, max_sequence_length=LENGTH, embedding_dim=DIM, lstm_units=UNITS)
    recon = algorithms.build_fed_recon(
        model_fn,
        loss_fn=nwp.loss_fn,
        model_distributor=communication.build_measured_broadcast(fed_recon.server_weights_type(model_fn)),
        model_aggregator=communication.MeasuredAggregationFactory(),
        simulation='per_client',  # The engine runs TFF's default broadcast and mean only (refused otherwise).
    )
    recon_measured = communication.communication_from_metrics(recon.next(recon.initialize(), _datasets()).metrics)

    def tff_model_fn():
        keras_model, _, _ = nwp.build_keras_model(
            LAYOUT, max_sequence_length=LENGTH, embedding_dim=DIM, lstm_units=UNITS
        )
        return tff.learning.models.from_keras_model(keras_model, loss=nwp.loss_fn(), input_spec=nwp.input_spec(LENGTH))

    fedavg = tff.learning.algorithms.build_weighted_fed_avg(
        tff_model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
        model_distributor=communication.build_measured_broadcast(
            tff.learning.models.weights_type_from_model(tff_model_fn)
        ),
        model_aggregator=communication.MeasuredAggregationFactory(),
    )
    fedavg_measured = communication.communication_from_metrics(fedavg.next(fedavg.initialize(), _datasets()).metrics)

    g, loc = _variable_counts()
    assert loc == LAYOUT.num_oov_buckets * DIM
    assert recon_measured == {
        'scalars_down_per_client': g,
        'bytes_down_per_client': 4 * g,
        'clients': 3,
        'scalars_up_per_client': g + 1,
        'bytes_up_per_client': 4 * (g + 1),
    }
    assert fedavg_measured['scalars_down_per_client'] == g + loc
    assert fedavg_measured['scalars_up_per_client'] == g + loc + 1
    # The paper's comparison: FedRecon 2|g| per client and round, FedAvg/FedYogi 2|l| + 2|g|.
    total_recon = recon_measured['scalars_down_per_client'] + recon_measured['scalars_up_per_client'] - 1
    total_fedavg = fedavg_measured['scalars_down_per_client'] + fedavg_measured['scalars_up_per_client'] - 1
    assert (total_recon, total_fedavg) == (2 * g, 2 * g + 2 * loc)


@pytest.mark.parametrize('inner', [None, tff.aggregators.UnweightedMeanFactory(), tff.aggregators.SumFactory()])
def test_measured_aggregation_returns_what_the_inner_aggregator_returns(inner):
    value_type = tff.StructType([('a', tff.TensorType(np.float32, [2])), ('b', tff.TensorType(np.float64, [3]))])
    if isinstance(inner, tff.aggregators.SumFactory):
        value_type = tff.TensorType(np.float32, [2])
    measured = communication.MeasuredAggregationFactory(inner).create(value_type, tff.TensorType(np.float32))
    reference = tff.aggregators.MeanFactory() if inner is None else inner
    if inner is None:
        reference = reference.create(value_type, tff.TensorType(np.float32))
    else:
        reference = reference.create(value_type)
    if isinstance(inner, tff.aggregators.SumFactory):
        values = [np.array([1.0, 2.0], np.float32), np.array([3.0, 5.0], np.float32)]
        expected_scalars, expected_bytes = 2.0, 8.0  # unweighted: the weight is not sent
    else:
        values = [
            collections.OrderedDict(a=np.array([1.0, 2.0], np.float32), b=np.array([1.0, 2.0, 3.0])),
            collections.OrderedDict(a=np.array([3.0, 6.0], np.float32), b=np.array([3.0, 4.0, 5.0])),
        ]
        # float32[2] + float64[3] (+ a float32 weight when the inner aggregator is weighted).
        expected_scalars, expected_bytes = (6.0, 36.0) if inner is None else (5.0, 32.0)
    weights = [np.float32(1.0), np.float32(3.0)]
    out = measured.next(measured.initialize(), values, weights)
    ref = (
        reference.next(reference.initialize(), values, weights)
        if inner is None
        else reference.next(reference.initialize(), values)
    )
    # The same inner aggregation of small integers (sums and means exact in float): the same numbers, exactly.
    tf.nest.map_structure(np.testing.assert_array_equal, out.result, ref.result)
    assert out.measurements['scalars_up_per_client'] == expected_scalars
    assert out.measurements['bytes_up_per_client'] == expected_bytes


def test_measured_broadcast_delivers_the_value():
    value_type = tff.TensorType(np.float64, [3])
    process = communication.build_measured_broadcast(value_type)

    @tff.federated_computation(tff.FederatedType(value_type, tff.SERVER), tff.FederatedType(np.int32, tff.CLIENTS))
    def run(value, client_ids):
        del client_ids  # Sets the number of clients.
        output = process.next(process.initialize(), value)
        return output.result, output.measurements

    received, measurements = run(np.array([1.0, 2.0, 3.0]), [0, 1])
    np.testing.assert_array_equal(received, [1.0, 2.0, 3.0])  # An all-equal CLIENTS value, sent as it is.
    assert measurements['bytes_down_per_client'] == 24.0 and measurements['scalars_down_per_client'] == 3.0
    assert measurements['clients'] == 2
