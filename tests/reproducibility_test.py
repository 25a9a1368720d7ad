"""Reproducibility: two runs with the same seed give bit-identical metrics (CPU); another seed gives other numbers.

End to end (for real, in a local TFF runtime): MovieLens MF with FedRecon, whose clients rebuild the model every
round (`model_fn()` inside `tf.init_scope`) and reconstruct the user embedding from its initial value; and FURL
(centralized Keras training on shuffled data, and FURL with private user embeddings). Model level: the
next-word-prediction LSTM (initial weights, and one FedRecon round, which reconstructs the local OOV table from
its initial value) and FedDVA's dual VAE (initial weights, and one client update, whose phases draw
reparameterization noise).
"""

import collections
import json
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import program
from fedpersonal import runtime
from fedpersonal.algorithms import feddva
from fedpersonal.core import model_loss_plan
from fedpersonal.data import text_pipeline
from fedpersonal.models import feddva_models
from fedpersonal.models import furl_models
from fedpersonal.models import matrix_factorization as mf
from fedpersonal.models import next_word_prediction as nwp
from fedpersonal.tasks import furl_personalization
from fedpersonal.tasks import movielens_mf


def _flatten(value, prefix=''):
    """`{path: leaf}` of nested dicts/lists, without wall-clock timings (the only legitimately varying values)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if 'seconds' not in str(key):
                out.update(_flatten(item, f'{prefix}/{key}'))
        return out
    if isinstance(value, (list, tuple)):
        out = {}
        for i, item in enumerate(value):
            out.update(_flatten(item, f'{prefix}[{i}]'))
        return out
    return {prefix: value}


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b


def _assert_identical(first, second):
    a, b = _flatten(first), _flatten(second)
    assert sorted(a) == sorted(b)
    differing = {k: (a[k], b[k]) for k in a if not _same(a[k], b[k])}
    assert not differing, f'same seed, different values: {differing}'


def _differing_numbers(first, second) -> list[str]:
    a, b = _flatten(first), _flatten(second)
    return [k for k in a if k in b and isinstance(a[k], float) and not _same(a[k], b[k])]


def _run_task(module, config):
    """`module.run(config)`; returns (its result rows, every configuration's metrics.csv rows)."""
    results = module.run(config)
    metrics = {
        name: program.ExperimentOutputs(config.output_dir, name).read_metrics() for name in config.configurations
    }
    return json.loads(json.dumps(results['rows'])), metrics


def test_movielens_same_seed_same_metrics(tmp_path):
    """FedRecon (the user embeddings start from the model's initializer every round) and centralized training on
    shuffled data: every metric of every round, and the final rows, bit-identical for the same seed."""

    def run(name, seed):
        config = movielens_mf.MovieLensMFConfig(
            output_dir=str(tmp_path / name),
            configurations=('fedrecon', 'centralized_standard'),
            synthetic_num_users=30,
            synthetic_num_items=40,
            num_latent_factors=8,
            total_rounds=3,
            clients_per_round=5,
            eval_clients=5,
            rounds_per_eval=3,  # The last round's evaluation (every round's training metrics are compared either way).
            rounds_per_checkpoint=10,
            recon_steps_max=5,
            post_recon_steps_max=5,
            centralized_max_epochs=2,
            seed=seed,
        )
        return _run_task(movielens_mf, config)

    with runtime.LocalRuntime():
        rows, metrics = run('a', seed=3)
        again_rows, again_metrics = run('b', seed=3)
        other_rows, other_metrics = run('c', seed=4)
    assert [int(r['round']) for r in metrics['fedrecon']] == [1, 2, 3]
    assert all(f'eval/{k}' in metrics['fedrecon'][-1] for k in ('rmse', 'accuracy'))
    assert len(metrics['centralized_standard']) == 2  # Epochs.
    _assert_identical(rows, again_rows)
    _assert_identical(metrics, again_metrics)

    for i, name in enumerate(('fedrecon', 'centralized_standard')):
        assert _differing_numbers(metrics[name], other_metrics[name]), name
        assert rows[i]['rmse'] != other_rows[i]['rmse'], name


def test_furl_same_seed_same_metrics(tmp_path):
    """FURL (private user embeddings in a client state store): bit-identical metrics for the same seed."""

    def run(name, seed):
        config = furl_personalization.FurlConfig(
            output_dir=str(tmp_path / name),
            configurations=('personalized_fl',),
            synthetic_num_users=8,
            epochs=1,
            clients_per_round=4,
            max_chars=8,
            char_embedding_dim=4,
            lstm_units=4,
            user_embedding_dim=3,
            mlp_units=6,
            batch_size=8,
            rounds_per_eval=2,  # The last round's evaluation.
            eval_clients=8,
            state_store='memory',
            seed=seed,
            simulation='per_client',  # The engine's compile of the character LSTM would triple this test's time;
        )  # the engine equals this path (tests/simulation/furl_engine_test.py); its determinism: the MovieLens test.
        return _run_task(furl_personalization, config)

    with runtime.LocalRuntime():
        rows, metrics = run('a', seed=5)
        again_rows, again_metrics = run('b', seed=5)
        other_rows, other_metrics = run('c', seed=6)
    assert len(metrics['personalized_fl']) == 2 and 'eval/accuracy' in metrics['personalized_fl'][-1]  # Rounds.
    _assert_identical(rows, again_rows)
    _assert_identical(metrics, again_metrics)
    assert _differing_numbers(rows, other_rows) and _differing_numbers(metrics, other_metrics)


# ------------------------------------------------------------------------------------------ model level: NWP
LAYOUT = text_pipeline.TokenLayout(vocab_size=6, num_oov_buckets=2)
SEQUENCE = 5


def _nwp_model_fn(seed):
    return nwp.model_fn(LAYOUT, max_sequence_length=SEQUENCE, embedding_dim=4, lstm_units=5, seed=seed)


def _weights(variables):
    return [v.numpy().copy() for v in variables]


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _nwp_client(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, LAYOUT.num_classes, size=[8, SEQUENCE + 1]).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=ids[:, :-1], y=ids[:, 1:])).batch(4)


def _nwp_process(seed):
    return algorithms.build_fed_recon(
        _nwp_model_fn(seed),
        loss_fn=nwp.loss_fn,
        metrics_fn=nwp.metrics_fn(LAYOUT),
        client_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=0.5),
        reconstruction_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=0.5),
    )


def _nwp_round(process):
    """One FedRecon round on two clients (the OOV table is reconstructed from model_fn's initial value)."""
    state = process.initialize()
    initial = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    output = process.run_round(state, [_nwp_client(1), _nwp_client(2)])
    trained = [np.asarray(w) for w in process.get_model_weights(output.state).trainable]
    return initial, trained, _flatten(output.metrics)


def test_next_word_prediction_model_and_fedrecon_round_are_seeded():
    first = _nwp_model_fn(0)()
    models = [_weights(first.keras_model.variables), _weights(_nwp_model_fn(0)().keras_model.variables)]
    with tf.Graph().as_default():  # A fresh graph, as in a TFF computation: the same initial values.
        graph_model = _nwp_model_fn(0)()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            models.append(session.run(graph_model.keras_model.variables))
    assert _equal(models[0], models[1]) and _equal(models[0], models[2])
    other = _weights(_nwp_model_fn(1)().keras_model.variables)
    names = [v.name for v in first.keras_model.variables]
    random = [i for i, name in enumerate(names) if 'bias' not in name]  # Biases start at zero (or one).
    assert len(random) == 6 and all(not np.array_equal(models[0][i], other[i]) for i in random)

    # One process run twice from `initialize()`: the round is deterministic. (That every build with one seed starts
    # from the same weights, in a fresh graph as in TFF: the models above.)
    with runtime.LocalRuntime():
        process = _nwp_process(0)
        initial, trained, metrics = _nwp_round(process)
        initial_again, trained_again, metrics_again = _nwp_round(process)
    assert _equal(initial, initial_again) and _equal(trained, trained_again) and metrics == metrics_again
    assert not _equal(trained, initial)


# --------------------------------------------------------------------------------------- model level: FedDVA
ARCH = feddva_models.DvaArchitecture(
    image_shape=(8, 8, 1),
    z_dim=2,
    c_dim=2,
    encoder_channels=(3, 4),
    decoder_dense=(7,),
    decoder_channels=(3, 2),
    num_classes=3,
)


def _dva_client(seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=[12, 8, 8, 1]).astype(np.float32)
    y = rng.integers(0, 3, size=12).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(6)


def _dva_variables(model):
    return model.global_trainable + model.private_trainable + model.private_non_trainable


def _dva_client_update(seed, client=1):
    """FedDVA's client update (decoder, z, c and head phases; reparameterization noise in the first three)."""
    model = feddva_models.DualVae(ARCH, seed=seed)
    initial = _weights(_dva_variables(model))
    adam = tff.learning.optimizers.build_adam(learning_rate=1e-2)
    plan = feddva.feddva_plan(
        decoder_epochs=1, z_epochs=1, c_epochs=1, head_epochs=1, optimizer=adam, head_optimizer=adam
    )
    metrics = tf.function(lambda ds: model_loss_plan.run_phases(model, plan, ds))(_dva_client(client))
    metrics = {k: [float(t) for t in v] for k, v in metrics.items()}
    return initial, _weights(_dva_variables(model)), metrics


def test_feddva_model_and_client_update_are_seeded():
    tf.random.set_seed(11)  # A graph-level seed does not change seeded (stateless) draws.
    initial, updated, metrics = _dva_client_update(0)
    tf.random.set_seed(12)
    initial_again, updated_again, metrics_again = _dva_client_update(0)
    assert _equal(initial, initial_again)
    assert _equal(updated, updated_again) and metrics == metrics_again
    assert not _equal(updated, initial)

    other_initial, other_updated, other_metrics = _dva_client_update(1)
    assert not _equal(initial, other_initial) and not _equal(updated, other_updated) and metrics != other_metrics
    cnn = [_weights(feddva_models.build_cnn_classifier((8, 8, 1), (4, 8), 8, 3, seed=s).variables) for s in (0, 0, 1)]
    assert _equal(cnn[0], cnn[1]) and not _equal(cnn[0], cnn[2])

    # The noise is deterministic, yet fresh per client (batch), per step and per participation (round); it does
    # not depend on the weights' values.
    model = feddva_models.DualVae(ARCH, seed=0)
    x1, x2 = (next(iter(_dva_client(c)))['x'] for c in (1, 2))
    eps = model.noise('z', x1)
    assert all(np.array_equal(a, b) for a, b in zip(eps, model.noise('z', x1)))
    assert eps[0].shape == (6, 2) and eps[1].shape == (6, 2)
    assert not np.array_equal(eps[0], model.noise('z', x2)[0])
    assert not np.array_equal(eps[0], model.noise('c', x1)[0])
    assert not np.array_equal(eps[0], model.noise('z', x1, step=1)[0])
    model.z_branch[0].assign_add(tf.fill(model.z_branch[0].shape, 1e-3))
    np.testing.assert_array_equal(eps[0], model.noise('z', x1)[0])
    model.participations.assign_add(1)
    assert not np.array_equal(eps[0], model.noise('z', x1)[0])
    samples = np.concatenate([model.noise('z', x)[0].numpy().ravel() for x in (x1, x2)])
    assert abs(samples.mean()) < 1.5 and 0.2 < samples.std() < 3.0


@pytest.mark.parametrize('seed', [0, 7])
def test_same_seed_same_initial_weights_across_builders(seed):
    """Every builder with one seed gives bit-identical weights twice, another seed other weights."""
    builders = {
        'mf_personal': lambda s: mf.personal_model_fn(10, 4, add_biases=True, seed=s)().keras_model.variables,
        'mf_table': lambda s: mf.table_keras_model(5, 10, 4, add_biases=True, seed=s).variables,
        'furl_private': lambda s: (
            furl_models.furl_model_fn(
                char_vocab_size=9,
                max_chars=6,
                num_features=2,
                num_classes=2,
                personalization='private',
                num_items=3,
                lstm_units=3,
                user_embedding_dim=2,
                mlp_units=(4,),
                seed=s,
            )().keras_model.variables
        ),
        'furl_table': lambda s: (
            furl_models.furl_model_fn(
                char_vocab_size=9,
                max_chars=6,
                num_features=2,
                num_classes=3,
                personalization='table',
                num_users=4,
                lstm_units=3,
                user_embedding_dim=2,
                mlp_units=(4,),
                seed=s,
            )().keras_model.variables
        ),
    }
    for name, build in builders.items():
        a, b, c = _weights(build(seed)), _weights(build(seed)), _weights(build(seed + 1))
        assert _equal(a, b), name
        assert not _equal(a, c), name
