"""The engine's evaluation equals the per-client TFF evaluation computations (aggregate and per-client metrics)."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import evaluation
from fedpersonal import metrics
from fedpersonal import models
from fedpersonal.models import matrix_factorization as mf
from tests import tolerances
from tests.simulation import next_word_data

NUM_ITEMS = 12


def _client(num_examples: int, seed: int, batch_size: int = 3) -> tf.data.Dataset:
    rng = np.random.default_rng(seed)
    items = rng.integers(0, NUM_ITEMS, size=num_examples)
    ratings = rng.integers(1, 6, size=num_examples).astype(np.float32)
    examples = collections.OrderedDict(x=items[:, None].astype(np.int64), y=ratings[:, None])
    return tf.data.Dataset.from_tensor_slices(examples).batch(batch_size)


# Unequal clients: one smaller than a batch, one with a single example (an empty query set after the split).
SIZES = (1, 2, 7, 11, 20)


def _datasets(offset: int = 0) -> list[tf.data.Dataset]:
    return [_client(n, seed=offset + i) for i, n in enumerate(SIZES)]


def _perturbed(arrays, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.asarray(a) + rng.normal(0.0, 0.5, size=np.shape(a)).astype(np.float32) for a in arrays]


# Depth: the deepest model evaluated here, the next-word LSTM (5 steps of 4 + 5 terms a gate, back through them,
# a batch of 4, 10 classes, 4 clients: 108), plus a metric's sum over a client's (at most 20) examples. Steps: the
# reconstruction and fine-tuning steps before the evaluation, at most 7 batches of 3, twice.
DEPTH = 108 + 20
STEPS = 2 * 7


def _assert_same(engine, reference):
    assert list(engine['eval']) == list(reference['eval'])
    bound = dict(depth=DEPTH, steps=STEPS)
    for name, value in reference['eval'].items():
        tolerances.assert_reordered_close(engine['eval'][name], value, err_msg=name, **bound)
    for name, values in reference['per_client'].items():
        # TFF's reservoir sampler keeps every client but not their order.
        tolerances.assert_reordered_close(
            np.sort(np.asarray(engine['per_client'][name])), np.sort(np.asarray(values)), err_msg=name, **bound
        )


def _mf_weights(model_fn, learn_local_init: bool, seed: int = 0) -> tff.learning.models.ModelWeights:
    model = model_fn()
    arrays = [v.numpy() for v in model.global_trainable_variables]
    if learn_local_init:
        arrays += [v.numpy() for v in model.local_trainable_variables]
    return tff.learning.models.ModelWeights(trainable=_perturbed(arrays, seed), non_trainable=[])


@pytest.mark.parametrize(
    'finetune, learn_local_init, optimizer',
    [pytest.param(False, False, 'sgd', marks=pytest.mark.numeric), (True, False, 'sgd'), (False, True, 'adam')],
    ids=['recon_eval', 'finetune', 'learned_init_adam'],
)
def test_recon_eval_engine_equals_per_client(finetune, learn_local_init, optimizer):
    model_fn = mf.personal_model_fn(NUM_ITEMS, num_latent_factors=3, add_biases=True, seed=0)
    build_optimizer = (
        (lambda: tff.learning.optimizers.build_sgdm(0.3))
        if optimizer == 'sgd'
        else (lambda: tff.learning.optimizers.build_adam(0.05))
    )
    kwargs = dict(
        loss_fn=tf.keras.losses.MeanSquaredError,
        metrics_fn=metrics.rating_metrics_fn(),
        reconstruction_optimizer=build_optimizer(),
        dataset_split=algorithms.ReconstructionSplit(recon_epochs=2, recon_steps_max=5),
        finetune_optimizer=build_optimizer() if finetune else None,
        learn_local_init=learn_local_init,
    )
    weights = _mf_weights(model_fn, learn_local_init)
    reference = evaluation.build_recon_eval(model_fn, simulation='per_client', **kwargs)(weights, _datasets())
    engine = evaluation.build_recon_eval(model_fn, group_size=2, **kwargs)  # 3 groups, the last one padded.
    ids = [f'c{i}' for i in range(len(SIZES))]
    _assert_same(engine(weights, _datasets(), client_ids=ids), reference)
    # A second call reads the cached clients (and their datasets are not rebuilt).
    again = engine(weights, [None] * len(SIZES), client_ids=ids)
    _assert_same(again, reference)
    assert float(reference['eval']['num_examples']) > 0
    # The one-example client's query set is empty: it has no metric values, so no distribution counts it (Keras
    # would report an RMSE of 0.0 for it).
    for result in (reference, again):
        summary = metrics.summarize_per_client(result['per_client'])
        assert (summary['rmse']['clients'], summary['rmse']['clients_without_examples']) == (len(SIZES) - 1, 1)


@pytest.mark.numeric
def test_standard_eval_engine_equals_per_client():
    def table_model_fn():
        keras_model = mf.table_keras_model(len(SIZES), NUM_ITEMS, 3, add_biases=True, seed=0)
        return models.from_keras_model(
            keras_model, input_spec=mf.table_input_spec(), global_variables=keras_model.trainable_variables
        )

    def table_client(user: int) -> tf.data.Dataset:
        rng = np.random.default_rng(user)
        n = SIZES[user]
        x = collections.OrderedDict(
            user_id=np.full([n, 1], user, np.int64), item_id=rng.integers(0, NUM_ITEMS, size=[n, 1]).astype(np.int64)
        )
        y = rng.integers(1, 6, size=[n, 1]).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(4)

    weights = tff.learning.models.ModelWeights(
        trainable=_perturbed([v.numpy() for v in table_model_fn().global_trainable_variables], 1), non_trainable=[]
    )
    kwargs = dict(loss_fn=tf.keras.losses.MeanSquaredError, metrics_fn=metrics.rating_metrics_fn())
    datasets = [table_client(u) for u in range(len(SIZES))]
    reference = evaluation.build_standard_eval(table_model_fn, simulation='per_client', **kwargs)(weights, datasets)
    engine = evaluation.build_standard_eval(table_model_fn, **kwargs)(weights, datasets)
    _assert_same(engine, reference)


def test_private_state_eval_engine_equals_per_client():
    model_fn = mf.personal_model_fn(NUM_ITEMS, num_latent_factors=3, add_biases=True, seed=0)
    kwargs = dict(loss_fn=tf.keras.losses.MeanSquaredError, metrics_fn=metrics.rating_metrics_fn())
    weights = _mf_weights(model_fn, learn_local_init=False, seed=2)
    model = model_fn()
    private = [
        tff.learning.models.ModelWeights(
            trainable=_perturbed([v.numpy() for v in model.local_trainable_variables], 10 + i), non_trainable=[]
        )
        for i in range(len(SIZES))
    ]
    reference = evaluation.build_private_state_eval(model_fn, simulation='per_client', **kwargs)(
        weights, _datasets(), private
    )
    engine = evaluation.build_private_state_eval(model_fn, group_size=3, **kwargs)(weights, _datasets(), private)
    _assert_same(engine, reference)
    # Each client's own state matters: swapping two clients' states changes their metrics.
    swapped = [private[1], private[0], *private[2:]]
    changed = evaluation.build_private_state_eval(model_fn, **kwargs)(weights, _datasets(), swapped)
    assert not np.allclose(np.sort(changed['per_client']['rmse']), np.sort(reference['per_client']['rmse']))


@pytest.mark.parametrize(
    'case',
    [test_standard_eval_engine_equals_per_client, test_private_state_eval_engine_equals_per_client],
    ids=['shared_weights', 'own_weights'],
)
def test_evaluation_calling_the_model_on_a_few_steps_at_a_time_equals_per_client(monkeypatch, case):
    """A group's examples beyond `EXAMPLES_PER_CALL` go through the model in a loop over chunks of steps (its
    activations' memory bounded): the same metrics as the per-client evaluation, in both prediction branches."""
    from fedpersonal.simulation import evaluation as engine_evaluation

    monkeypatch.setattr(engine_evaluation, 'EXAMPLES_PER_CALL', 4)
    chosen, steps_per_call = [], engine_evaluation._steps_per_call  # pylint: disable=protected-access
    monkeypatch.setattr(
        engine_evaluation,
        '_steps_per_call',
        lambda mask: chosen.append((mask.shape, steps_per_call(mask))) or chosen[-1][1],
    )
    case()
    assert any(k is not None and k < shape[1] for shape, k in chosen)  # The loop ran.


@pytest.mark.parametrize('limit', [4, 2048])
def test_steps_per_call_bounds_a_calls_examples_and_divides_the_steps(monkeypatch, limit):
    from fedpersonal.simulation import evaluation as engine_evaluation

    monkeypatch.setattr(engine_evaluation, 'EXAMPLES_PER_CALL', limit)
    for clients, steps, batch in [(20, 512, 10), (5, 8, 3), (1, 1, 10), (3, 6, 2), (2, 64, 1)]:
        k = engine_evaluation._steps_per_call(tf.zeros([clients, steps, batch]))  # pylint: disable=protected-access
        if k is None:  # One call: it fits, or no smaller chunk divides the steps.
            assert clients * steps * batch <= limit or steps % 2 == 1 or steps == 1
        else:
            assert steps % k == 0 and k < steps
            assert clients * k * batch <= limit or k % 2 == 1 or k == 1
            assert clients * 2 * k * batch > limit  # The largest such chunk.


@pytest.mark.parametrize('finetune', [False, True], ids=['recon_eval', 'finetune'])
def test_next_word_recon_eval_engine_equals_per_client(finetune):
    """An LSTM with local OOV embeddings, a loss and metrics that skip the pad token, padded sequences."""
    from fedpersonal.models import next_word_prediction as nwp

    layout, datasets, model_fn = next_word_data.LAYOUT, next_word_data.client_datasets(), next_word_data.model_fn
    kwargs = dict(
        loss_fn=nwp.loss_fn,
        metrics_fn=nwp.metrics_fn(layout),
        reconstruction_optimizer=tff.learning.optimizers.build_sgdm(0.5),
        dataset_split=algorithms.ReconstructionSplit(recon_epochs=2),
        finetune_optimizer=tff.learning.optimizers.build_sgdm(0.2) if finetune else None,
    )
    weights = _mf_weights(model_fn, learn_local_init=False, seed=5)
    reference = evaluation.build_recon_eval(model_fn, simulation='per_client', **kwargs)(weights, datasets)
    engine = evaluation.build_recon_eval(model_fn, group_size=3, **kwargs)(weights, datasets)
    _assert_same(engine, reference)
    assert set(reference['eval']) >= {'accuracy_no_oov_no_eos', 'loss'}


def test_groups_shrink_to_the_predictions_memory_budget(monkeypatch):
    from fedpersonal.simulation import evaluation as engine_evaluation

    model_fn = mf.personal_model_fn(NUM_ITEMS, num_latent_factors=3, add_biases=True, seed=0)
    kwargs = dict(loss_fn=tf.keras.losses.MeanSquaredError, metrics_fn=metrics.rating_metrics_fn())
    weights = _mf_weights(model_fn, learn_local_init=False)
    reference = evaluation.build_recon_eval(model_fn, simulation='per_client', **kwargs)(weights, _datasets())
    monkeypatch.setattr(engine_evaluation, 'PREDICTIONS_BUDGET_BYTES', 1)  # Not even one client's predictions.
    engine = evaluation.build_recon_eval(model_fn, **kwargs)
    _assert_same(engine(weights, _datasets()), reference)
    assert engine._packer.group_size == 1  # pylint: disable=protected-access
