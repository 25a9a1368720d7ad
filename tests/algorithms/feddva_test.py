"""FedDVA: the phase structure, decoders kept on clients (privacy audit, leaky variant), rounds with a store."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms import feddva
from fedpersonal.models import feddva_models as fm
from fedpersonal.privacy import audit

TINY = fm.DvaArchitecture(
    image_shape=(8, 8, 1),
    z_dim=2,
    c_dim=2,
    encoder_channels=(3, 4),
    decoder_dense=(7,),
    decoder_channels=(3, 2),
    num_classes=3,
)


def dataset(seed, n=12):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=[n, 8, 8, 1]).astype(np.float32)
    y = rng.integers(0, 3, size=n).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(6)


def snapshot(model):
    groups = {
        'z': model.z_branch,
        'c': model.c_branch,
        'decoder': model.decoder_variables,
        'head': model.head_variables,
    }
    return {k: [v.numpy().copy() for v in vs] for k, vs in groups.items()}


def changed(before, after):
    return {k for k in before if any(not np.array_equal(a, b) for a, b in zip(before[k], after[k]))}


def test_each_phase_steps_only_its_variables():
    tf.keras.utils.set_random_seed(0)
    model = fm.DualVae(TINY)
    adam = tff.learning.optimizers.build_adam(learning_rate=1e-2)
    data = dataset(0)
    for phase, expected in (('decoder', {'decoder'}), ('z', {'z'}), ('c', {'c'}), ('head', {'head'})):
        before = snapshot(model)
        count, total, _ = tf.function(lambda ds, p=phase: feddva.run_phase(model, p, ds, 2, adam))(data)
        assert int(count) == 24 and np.isfinite(float(total))
        assert changed(before, snapshot(model)) == expected, phase


def test_head_phase_tunes_the_encoders_only_when_asked():
    tf.keras.utils.set_random_seed(0)
    model = fm.DualVae(TINY, head_tunes_encoders=True)
    adam = tff.learning.optimizers.build_adam(learning_rate=1e-2)
    before = snapshot(model)
    encoders = model.z_encoder.non_trainable_variables + model.c_encoder.non_trainable_variables
    encoder_stats = [v.numpy().copy() for v in encoders]
    assert encoder_stats
    tf.function(lambda ds: feddva.run_phase(model, 'head', ds, 2, adam))(dataset(0))
    assert changed(before, snapshot(model)) == {'head', 'z', 'c'}
    # The encoders run in inference mode: their batch-norm statistics do not move.
    after = model.z_encoder.non_trainable_variables + model.c_encoder.non_trainable_variables
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(encoder_stats, after))
    frozen = fm.DualVae(TINY)
    assert len(frozen.variables_of('head')) == len(frozen.head_variables)


def build(head_epochs=1):
    return feddva.build_feddva(
        lambda: fm.DualVae(TINY), element_spec=dataset(0).element_spec, head_epochs=head_epochs, learning_rate=1e-2
    )


def test_decoders_stay_on_clients_and_encoders_are_averaged():
    process = build()
    signature = process.next.type_signature
    assert signature.parameter[2].placement is tff.CLIENTS
    assert signature.result.private_states.placement is tff.CLIENTS
    server_shapes = audit.tensor_shapes(signature.result.state, signature.result.metrics)
    decoder_shapes = {tuple(t.shape) for t in process.private_state_type.trainable}
    decoder_kernels = {(2 + 2, 7), (7, 2 * 2 * 3)}  # dec_dense0 and dec_project kernels: shapes no encoder has.
    assert decoder_kernels <= decoder_shapes and not decoder_kernels & server_shapes
    assert (2, 8 * 8) in server_shapes  # The c-encoder's z embedding is federated.

    state = process.initialize()
    private = [process.initial_private_state() for _ in range(2)]
    out = process.run_round(state, [dataset(1), dataset(2)], private)
    train = out.metrics['client_work']['train']
    assert train['num_examples'] == 24 and np.isfinite(train['c_loss'])
    # Each client's decoder trained on its own data only: the two private states differ.
    assert not np.allclose(out.private_states[0].trainable[0], out.private_states[1].trainable[0])
    # A second round starts from the returned private states (stateful decoders). (The same two clients: a round
    # of another size would trace and compile the engine's group computation again, 12 s of this test.)
    out2 = process.run_round(out.state, [dataset(1), dataset(2)], out.private_states)
    assert not np.allclose(out2.private_states[0].trainable[0], out.private_states[0].trainable[0])
    assert not np.allclose(
        process.get_model_weights(out2.state).trainable[0], process.get_model_weights(state).trainable[0]
    )


def test_privacy_audit_passes_and_catches_a_decoder_leak():
    process = build(head_epochs=0)
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    params = process.next.type_signature.parameter

    @tff.tensorflow.computation(params[2].member)
    def decoder_mean(private):
        return tf.reduce_mean(private.trainable[0])

    @tff.federated_computation(params[0], params[1], params[2])
    def leaky(state, data, private):
        out = process.next(state, data, private)
        return out.state, tff.federated_mean(tff.federated_map(decoder_mean, private)), out.private_states

    violations = audit.audit_private_dataflow(leaky, private_parameter_index=2)
    assert violations and any(v.where == 'federated_mean' for v in violations)


def test_rejects_negative_epochs():
    with pytest.raises(ValueError, match='z_epochs must be >= 0'):
        feddva.build_feddva(lambda: fm.DualVae(TINY), element_spec=dataset(0).element_spec, z_epochs=-1)
