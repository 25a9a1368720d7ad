"""TFF 0.87 compatibility: TFF code runs against fedpersonal with its import changed (docs/MIGRATING.md)."""

import collections
import inspect
import linecache
import os
import re
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import backends
from fedpersonal import evaluation
from fedpersonal import tff_compat
from tests import tolerances

_MIGRATING = os.path.join(os.path.dirname(__file__), '..', 'docs', 'MIGRATING.md')
SGD = tff.learning.optimizers.build_sgdm


def _blocks() -> dict[str, str]:
    with open(_MIGRATING) as f:
        found = re.findall(r'```python\n# migrating: (\w+)\n(.*?)```', f.read(), flags=re.S)
    return dict(found)


def _run(*names: str, namespace: dict | None = None) -> dict:
    namespace = {'__name__': 'migrating'} if namespace is None else namespace
    blocks = _blocks()
    for name in names:
        filename = f'<MIGRATING.md {name}>'
        # Registered source: AutoGraph reads the functions' source (else it warns that it cannot convert them).
        linecache.cache[filename] = (len(blocks[name]), None, blocks[name].splitlines(True), filename)
        exec(compile(blocks[name], filename, 'exec'), namespace)  # pylint: disable=exec-used
    return namespace


# MIGRATING.md's experiment: DIM = 2 (the prediction's dot product), 3 clients of 8 ratings in batches of 2. The
# longest chain of additions feeding an item embedding in one step: the dot product, the batch's gradient sum and
# the mean over the 3 clients.
DEPTH = 2 + 2 + 3
# A metric (loss, mean absolute error) adds each example's prediction (the dot product) over the round's examples:
# at most 3 clients x 8 ratings.
METRIC_DEPTH = 2 + 3 * 8
# Its training: 3 rounds of 4 reconstruction steps (2 epochs over 2 support batches) and 3 update steps (2 epochs
# capped at 3), then the evaluation's 4 reconstruction steps.
STEPS = 3 * (4 + 3) + 4
# An evaluation from the initial weights: its reconstruction steps (at most 2 epochs over 2 support batches) only.
EVAL_STEPS = 4


def _assert_close(actual, expected, *, steps, depth=METRIC_DEPTH):
    """Metrics equal: counts exactly, float metrics up to the reordering of their float32 sums."""
    assert list(actual) == list(expected), (list(actual), list(expected))
    for name in expected:
        a, e = np.asarray(actual[name]), np.asarray(expected[name])
        if np.issubdtype(e.dtype, np.integer):
            np.testing.assert_array_equal(a, e, err_msg=name)
        else:
            tolerances.assert_reordered_close(a, e, depth=depth, steps=steps, err_msg=name)


def _counting_model_fns(model_fn):
    """`(counts, counting)`: ``counting(key)`` is a model function that calls `model_fn` and counts the calls in
    ``counts[key]``."""
    counts = collections.Counter()

    def counting(key):
        def counted():
            counts[key] += 1
            return model_fn()

        return counted

    return counts, counting


def _initial_weights(model_fn):
    variables = tff.learning.models.ReconstructionModel.get_global_variables(model_fn())
    return tf.nest.map_structure(lambda v: v.numpy(), variables)


@pytest.fixture(scope='module')
def runs():
    """The MIGRATING.md experiment run by TFF and by fedpersonal (tff_compat, then the native API)."""
    reference = _run('common', 'tff')
    ours = _run('common', 'fedpersonal')
    native = _run('native', namespace=dict(ours))
    return reference, ours, native


def test_the_two_blocks_differ_only_in_their_import():
    blocks = _blocks()
    assert set(blocks) == {'common', 'tff', 'fedpersonal', 'native'}
    tff_lines, our_lines = blocks['tff'].splitlines(), blocks['fedpersonal'].splitlines()
    assert tff_lines[0] == 'algorithms = tff.learning.algorithms'
    assert our_lines[0] == 'from fedpersonal import tff_compat as algorithms'
    assert tff_lines[1:] == our_lines[1:]


@pytest.mark.numeric
def test_tff_code_gives_tff_numbers(runs):
    reference, ours, _ = runs
    assert isinstance(ours['process'], tff.learning.templates.LearningProcess)
    assert isinstance(ours['eval_process'], tff.learning.templates.LearningProcess)
    # A NumExamplesCounter in metrics_fn is accepted (the num_examples fedpersonal reports), and TFF's metric
    # layout is kept: client_work/train, client_work/eval/{current,total}_rounds_metrics.
    assert list(ours['train_metrics']) == ['num_examples', 'mean_absolute_error', 'loss']
    _assert_close(ours['train_metrics'], reference['train_metrics'], steps=STEPS)
    _assert_close(ours['eval_metrics'], reference['eval_metrics'], steps=STEPS)
    _assert_close(
        ours['eval_output'].metrics['client_work']['eval']['total_rounds_metrics'],
        reference['eval_output'].metrics['client_work']['eval']['total_rounds_metrics'],
        steps=STEPS,
    )
    assert set(ours['eval_output'].metrics) == set(reference['eval_output'].metrics)
    initial = tf.nest.flatten(_initial_weights(ours['model_fn']))
    for ours_w, tff_w, start in zip(
        tf.nest.flatten(ours['process'].get_model_weights(ours['state'])),
        tf.nest.flatten(reference['process'].get_model_weights(reference['state'])),
        initial,
    ):
        bound = tolerances.reorder_bound(depth=DEPTH, scale=tolerances.magnitude(tff_w), steps=STEPS)
        assert np.abs(tff_w - start).max() > 100 * bound  # Training moved the weights far beyond the bound.
        tolerances.assert_reordered_close(ours_w, tff_w, depth=DEPTH, steps=STEPS)
    # post_recon_epochs=2 capped at 3 batches: 3 batches of 2 per client are evaluated, as TFF evaluates them.
    assert ours['eval_metrics']['num_examples'] == 3 * 3 * 2


@pytest.mark.numeric
def test_the_native_api_gives_the_same_numbers(runs):
    reference, _, native = runs
    assert native['process'].simulation == 'engine'  # TFF's own Keras ReconstructionModel on the fast engine.
    train = native['output'].metrics['client_work']['train']
    _assert_close(train, reference['train_metrics'], steps=STEPS)
    _assert_close(native['result']['eval'], reference['eval_metrics'], steps=STEPS)


@pytest.mark.numeric
def test_default_split_is_the_only_difference():
    """`dataset_split_fn=None`: fedpersonal's hash split, i.e. TFF given fedpersonal's split function."""
    ns = _run('common')
    model_fn, datasets = ns['model_fn'], ns['client_datasets']
    weights = _initial_weights(model_fn)

    def evaluate(builder, **kwargs):
        process = builder(model_fn, loss_fn=tf.keras.losses.MeanSquaredError, **kwargs)
        state = process.set_model_weights(process.initialize(), weights)
        return process.next(state, datasets).metrics['client_work']['eval']['current_round_metrics']

    ours = evaluate(tff_compat.build_fed_recon_eval)
    reference = evaluate(
        tff.learning.algorithms.build_fed_recon_eval,
        metrics_fn=lambda: [tff.learning.metrics.NumExamplesCounter()],
        dataset_split_fn=algorithms.build_dataset_split_fn(algorithms.ReconstructionSplit()),
    )
    # No NumExamplesCounter asked for: TFF's names, without the num_examples fedpersonal's own builders add.
    assert list(ours) == ['loss']
    _assert_close(ours, collections.OrderedDict(loss=reference['loss']), steps=EVAL_STEPS)
    tff_default = evaluate(
        tff.learning.algorithms.build_fed_recon_eval, metrics_fn=lambda: [tff.learning.metrics.NumExamplesCounter()]
    )
    # TFF's even/odd batches: other examples, a loss far outside the bound the equal splits are held to.
    bound = tolerances.reorder_bound(depth=METRIC_DEPTH, scale=tolerances.magnitude(ours['loss']), steps=EVAL_STEPS)
    assert abs(float(ours['loss']) - float(tff_default['loss'])) > 100 * bound


def test_post_reconstruction_epochs_and_steps_are_applied_and_zero_is_tffs():
    ns = _run('common')
    model_fn, datasets = ns['model_fn'], ns['client_datasets']  # 3 clients, 8 examples in batches of 2.
    weights = _initial_weights(model_fn)

    def evaluate(builder, split):
        process = builder(model_fn, loss_fn=tf.keras.losses.MeanSquaredError, dataset_split_fn=split)
        state = process.set_model_weights(process.initialize(), weights)
        metrics = process.next(state, datasets).metrics['client_work']['eval']['current_round_metrics']
        return collections.OrderedDict(
            (k, metrics[k]) for k in ('loss',) + (('num_examples',) if 'num_examples' in metrics else ())
        )

    def counted(split):
        return evaluate(evaluation.build_fed_recon_eval, split)['num_examples']

    split = algorithms.ReconstructionSplit(strategy='order')  # 4 query examples a client.
    assert counted(split) == 12
    assert counted(algorithms.ReconstructionSplit(strategy='order', post_recon_epochs=2)) == 24
    assert counted(algorithms.ReconstructionSplit(strategy='order', post_recon_epochs=2, post_recon_steps_max=3)) == 18
    zero = tff.learning.models.ReconstructionModel.build_dataset_split_fn(post_recon_epochs=0, split_dataset=True)
    ours = evaluate(evaluation.build_fed_recon_eval, zero)
    assert ours['num_examples'] == 0
    # No example evaluated: both report the same constant, exactly.
    np.testing.assert_array_equal(ours['loss'], evaluate(tff.learning.algorithms.build_fed_recon_eval, zero)['loss'])
    assert counted(algorithms.ReconstructionSplit(post_recon_epochs=0)) == 0


def test_post_recon_epochs_zero_trains_nothing_as_in_tff():
    ns = _run('common')
    process = algorithms.build_fed_recon(
        ns['model_fn'],
        loss_fn=tf.keras.losses.MeanSquaredError,
        dataset_split=algorithms.ReconstructionSplit(post_recon_epochs=0),
    )
    state = process.initialize()
    output = process.run_round(state, ns['client_datasets'])
    assert output.metrics['client_work']['train']['num_examples'] == 0
    for before, after in zip(
        tf.nest.flatten(process.get_model_weights(state)), tf.nest.flatten(process.get_model_weights(output.state))
    ):
        np.testing.assert_array_equal(before, after)


def test_tff_compat_reports_tffs_metric_names():
    """num_examples only where the user's metrics ask for it; the other numbers unchanged."""
    ns = _run('common')
    mse, mae = tf.keras.losses.MeanSquaredError, tf.keras.metrics.MeanAbsoluteError
    names = {}
    for key, module in (('tff', tff.learning.algorithms), ('ours', tff_compat)):
        for counter in (False, True):
            metrics_fn = lambda counter=counter: [tff.learning.metrics.NumExamplesCounter()] * counter + [mae()]
            process = module.build_fed_recon(ns['model_fn'], loss_fn=mse, metrics_fn=metrics_fn)
            train = process.next(process.initialize(), ns['client_datasets']).metrics['client_work']['train']
            evaluate = module.build_fed_recon_eval(ns['model_fn'], loss_fn=mse, metrics_fn=metrics_fn)
            current = evaluate.next(evaluate.initialize(), ns['client_datasets']).metrics['client_work']['eval']
            names[key, counter] = (list(train), list(current['current_round_metrics']))
    assert names['ours', False] == names['tff', False] == (['mean_absolute_error', 'loss'],) * 2
    assert names['ours', True] == names['tff', True]


def test_building_fed_recon_calls_model_fn_as_often_as_tff():
    counts, counting = _counting_model_fns(_run('common')['model_fn'])
    mse = tf.keras.losses.MeanSquaredError
    tff.learning.algorithms.build_fed_recon(counting('tff'), loss_fn=mse)
    tff_compat.build_fed_recon(counting('ours'), loss_fn=mse)
    assert counts['ours'] == counts['tff'], counts


def test_building_the_evaluation_calls_model_fn_no_more_than_tff():
    counts, counting = _counting_model_fns(_run('common')['model_fn'])
    mse = tf.keras.losses.MeanSquaredError
    tff.learning.algorithms.build_fed_recon_eval(counting('tff'), loss_fn=mse)
    evaluation.build_fed_recon_eval(counting('process'), loss_fn=mse)
    evaluation.build_recon_eval(counting('function'), loss_fn=mse, simulation='per_client')
    evaluation.build_recon_eval(counting('engine'), loss_fn=mse)
    assert counts['tff'] >= 1
    for ours in ('process', 'function', 'engine'):
        assert counts[ours] <= counts['tff'], counts


def test_tff_split_functions_and_counters_in_build_recon_eval_engine_and_per_client():
    ns = _run('common')
    model_fn, datasets = ns['model_fn'], ns['client_datasets']
    weights = _initial_weights(model_fn)
    split_fn = tff.learning.models.ReconstructionModel.build_dataset_split_fn(recon_epochs=2, split_dataset=True)

    def metrics_fn():
        return [tff.learning.metrics.NumBatchesCounter(), tff.learning.metrics.NumExamplesCounter()]

    kwargs = dict(loss_fn=tf.keras.losses.MeanSquaredError, metrics_fn=metrics_fn, dataset_split_fn=split_fn)
    reference = tff.learning.algorithms.build_fed_recon_eval(model_fn, **kwargs)
    state = reference.set_model_weights(reference.initialize(), weights)
    expected = reference.next(state, datasets).metrics['client_work']['eval']['current_round_metrics']
    assert expected['num_batches'] == 6 and expected['num_examples'] == 12
    for simulation in ('per_client', 'engine'):
        result = evaluation.build_recon_eval(model_fn, simulation=simulation, **kwargs)(weights, datasets)
        _assert_close(result['eval'], expected, steps=EVAL_STEPS)


def test_counters_in_training_metrics_on_the_engine():
    ns = _run('common')

    def metrics_fn():
        return [tff.learning.metrics.NumExamplesCounter(), tff.learning.metrics.NumBatchesCounter()]

    split = algorithms.ReconstructionSplit(strategy='order')
    outputs = {}
    for simulation in ('engine', 'per_client'):
        process = algorithms.build_fed_recon(
            ns['model_fn'],
            loss_fn=tf.keras.losses.MeanSquaredError,
            metrics_fn=metrics_fn,
            dataset_split_fn=split,
            simulation=simulation,
        )
        outputs[simulation] = process.run_round(process.initialize(), ns['client_datasets']).metrics
    train = outputs['engine']['client_work']['train']
    assert (train['num_examples'], train['num_batches']) == (12, 6)
    # One round from the same start: 2 reconstruction steps (the 2 support batches) and 2 update steps.
    _assert_close(train, outputs['per_client']['client_work']['train'], steps=4)


def test_keras_optimizer_functions_and_model_distributor_as_tff_accepts_them():
    ns = _run('common')
    model_fn, datasets = ns['model_fn'], ns['client_datasets']
    weights = _initial_weights(model_fn)
    weights_type = tff.types.tensorflow_to_type(
        tf.nest.map_structure(lambda a: tf.TensorSpec(a.shape, a.dtype), weights)
    )

    def evaluate(builder):
        process = builder(
            model_fn,
            loss_fn=tf.keras.losses.MeanSquaredError,
            reconstruction_optimizer_fn=lambda: tf.keras.optimizers.SGD(learning_rate=0.1),
            model_distributor=tff.learning.templates.build_broadcast_process(weights_type),
            dataset_split_fn=tff.learning.models.ReconstructionModel.build_dataset_split_fn(split_dataset=True),
        )
        state = process.set_model_weights(process.initialize(), weights)
        return process.next(state, datasets).metrics['client_work']['eval']['current_round_metrics']['loss']

    # The initial weights, one reconstruction epoch (2 support batches): the loss up to its sums' reordering.
    tolerances.assert_reordered_close(
        evaluate(tff_compat.build_fed_recon_eval),
        evaluate(tff.learning.algorithms.build_fed_recon_eval),
        depth=METRIC_DEPTH,
        steps=2,
    )
    # Training: both accepted on the per-client path; on the engine's default too, which runs them per client.
    process = tff_compat.build_fed_recon(
        model_fn,
        loss_fn=tf.keras.losses.MeanSquaredError,
        client_optimizer_fn=lambda: tf.keras.optimizers.SGD(learning_rate=0.1),
        model_distributor=tff.learning.templates.build_broadcast_process(weights_type),
    )
    assert np.isfinite(process.next(process.initialize(), datasets).metrics['client_work']['train']['loss'])
    for extra, named in (
        (dict(client_optimizer_fn=lambda: tf.keras.optimizers.SGD()), 'Keras optimizer'),
        (dict(model_distributor=tff.learning.templates.build_broadcast_process(weights_type)), 'model_distributor'),
    ):
        with mock.patch.object(backends.logging, 'info') as log:
            process = algorithms.build_fed_recon(model_fn, loss_fn=tf.keras.losses.MeanSquaredError, **extra)
        assert process.simulation == 'per_client'
        (message, *args), _ = log.call_args
        assert named in message % tuple(args)


ALIASES = [
    ('server_optimizer', 'server_optimizer_fn', SGD(1.0)),
    ('client_optimizer', 'client_optimizer_fn', SGD(0.1)),
    ('reconstruction_optimizer', 'reconstruction_optimizer_fn', SGD(0.1)),
    ('dataset_split', 'dataset_split_fn', algorithms.ReconstructionSplit()),
    ('model_aggregator', 'model_aggregator_factory', tff.aggregators.MeanFactory()),
]


def _never_called():
    raise AssertionError('model_fn called although the arguments are refused first')


@pytest.mark.parametrize('name,alias,value', ALIASES)
def test_an_argument_under_both_names_is_refused_naming_both(name, alias, value):
    with pytest.raises(TypeError, match=f"'{name}'.*'{alias}'"):
        algorithms.build_fed_recon(
            _never_called, loss_fn=tf.keras.losses.MeanSquaredError, **{name: value, alias: value}
        )
    if name in ('reconstruction_optimizer', 'dataset_split'):
        for builder in (evaluation.build_recon_eval, evaluation.build_fed_recon_eval):
            with pytest.raises(TypeError, match=f"'{name}'.*'{alias}'"):
                builder(_never_called, loss_fn=tf.keras.losses.MeanSquaredError, **{name: value, alias: value})


def test_every_tff_argument_is_taken_and_others_are_refused_by_name():
    pairs = [
        (tff.learning.algorithms.build_fed_recon, tff_compat.build_fed_recon),
        (tff.learning.algorithms.build_fed_recon, algorithms.build_fed_recon),
        (tff.learning.algorithms.build_fed_recon_eval, tff_compat.build_fed_recon_eval),
    ]
    for theirs, ours in pairs:
        missing = set(inspect.signature(theirs).parameters) - set(inspect.signature(ours).parameters)
        assert not missing, (ours.__module__, missing)
    mse = tf.keras.losses.MeanSquaredError
    for tff_arg in ('model_distributor', 'metrics_aggregation_process'):
        with pytest.raises(TypeError, match=tff_arg):
            evaluation.build_recon_eval(_never_called, loss_fn=mse, **{tff_arg: object()})
    for builder in (tff_compat.build_fed_recon, tff_compat.build_fed_recon_eval, algorithms.build_fed_recon):
        with pytest.raises(TypeError, match='personalization_fn'):
            builder(_never_called, loss_fn=mse, personalization_fn=None)
    with pytest.raises(TypeError, match='simulation'):  # tff_compat returns TFF's per-client LearningProcess.
        tff_compat.build_fed_recon(_never_called, loss_fn=mse, simulation='engine')
    with pytest.raises(TypeError, match='metrics_aggregation_process'):
        evaluation.build_fed_recon_eval(_never_called, loss_fn=mse, metrics_aggregation_process=object())
