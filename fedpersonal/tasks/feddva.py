"""FedDVA experiments: personalized classification in two settings, and disentanglement evidence.

Settings (both on `num_clients` clients with per-client train/test splits, `fedpersonal.data.federated_images`):

* `heterogeneous_inputs`: client marks (mark type = client id mod 4) on near-uniform labels (Dirichlet alpha 100);
* `heterogeneous_outputs`: skewed labels (Dirichlet alpha 0.5), no marks (unless `marks_in_outputs`).

Methods (all evaluated as the example-weighted accuracy over every client's own test split):

* `feddva`: the dual VAE trained by `fedpersonal.algorithms.build_feddva` (encoders federated; decoder, head and
  batch-norm statistics private in a client state store); each client's personalized head on the fixed
  [mu_z, mu_c] is trained in the same rounds (`head_epochs`): how good the unsupervised representations are;
* `feddva_tuned`: the same, but the head phase also tunes both encoders through the classification loss (the
  paper's classification protocol: "we tune the dual encoders along with a classification head"), at the
  paper's single learning rate (`learning_rate`; `head_learning_rate` is the frozen-encoder head's);
* `fedavg`: TFF's weighted FedAvg of the CNN classifier (`feddva_networks.build_cnn_classifier`);
* `fedavg_ft`: the FedAvg model fine-tuned on each client's training data (`finetune_epochs`, fresh Adam);
* `ditto`: `fedpersonal.algorithms.build_ditto`, the personal models' accuracy.

FedDVA and Ditto run on the fast simulation engine by default (``--simulation``, ``--group_size``:
`fedpersonal.simulation`); ``--simulation=per_client`` runs one TFF client computation per client (FedDVA: the
same results to float precision).

Disentanglement (FedDVA in `disentanglement_setting`): linear probes (client from c vs z, label from z vs c,
mark type from c vs z), manifold grids through client decoders, t-SNE of z and c coloured by client, label and
mark type; on `feddva` (whose encoders see no labels) when it runs, else on `feddva_tuned`.

Configuration flows one way: flags -> `FeddvaConfig` -> builders.

Every random choice derives from `FeddvaConfig.seed`, so two runs with the same config give bit-identical metrics
(on CPU): the generated images, client allocation and marks, every model's initial weights (`DualVae` and
`build_cnn_classifier` with ``seed``), FedDVA's reparameterization noise (stateless draws seeded by ``seed``, the
phase, the batch, the step and the client's participation count: `feddva_models.DualVae.noise`), the clients' batch shuffling (`tf.data`
shuffle with ``seed``), the clients sampled each round ((``seed``, round)), the probes and the projection. `run`
also sets TensorFlow's global seed to ``seed``, so the op-level seeds combine with the same graph-level seed
whatever ran earlier in the process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal import client_state
from fedpersonal import program
from fedpersonal.algorithms import ditto
from fedpersonal.algorithms import feddva
from fedpersonal.data import federated_images
from fedpersonal.program import optimizers
from fedpersonal.program import run_record
from fedpersonal.program import training_loop
from fedpersonal.tasks.feddva_analysis import METHOD_NAMES
from fedpersonal.tasks.feddva_analysis import analyze_disentanglement
from fedpersonal.tasks.feddva_analysis import encode_clients
from fedpersonal.tasks.feddva_analysis import load_curves
from fedpersonal.tasks.feddva_analysis import local_logistic_heads
from fedpersonal.tasks.feddva_analysis import plot_accuracy_curves
from fedpersonal.tasks.feddva_config import ARCHITECTURE_NAMES as ARCHITECTURE_NAMES
from fedpersonal.tasks.feddva_config import DATASETS as DATASETS
from fedpersonal.tasks.feddva_config import METHODS as METHODS
from fedpersonal.tasks.feddva_config import SETTINGS as SETTINGS
from fedpersonal.tasks.feddva_config import FeddvaConfig as FeddvaConfig
from fedpersonal.tasks.feddva_config import architectures
from fedpersonal.tasks.feddva_setting import SETTING_NAMES
from fedpersonal.tasks.feddva_setting import FeddvaTask as FeddvaTask
from fedpersonal.tasks.feddva_setting import load_setting as load_setting

ARCHITECTURES = architectures()


def _open_store(task: FeddvaTask, process, outputs: program.ExperimentOutputs):
    """The store of every client's private state; a client not yet trained starts from the initial one."""
    initial = training_loop.from_model_weights(process.initial_private_state())
    default = lambda client_id: [a.copy() for a in initial]
    return program.open_store(task.config.state_store, outputs, client_state.spec_of(initial), default)


def run_feddva(
    task: FeddvaTask, outputs: program.ExperimentOutputs, *, head_tunes_encoders: bool = False
) -> tuple[dict[str, Any], Any]:
    """Trains FedDVA; returns (row, analysis context with the final weights and client states)."""
    cfg = task.config
    model_fn = functools.partial(task.dva_fn, head_tunes_encoders)
    process = feddva.build_feddva(
        model_fn,
        element_spec=task.element_spec,
        decoder_epochs=cfg.decoder_epochs,
        z_epochs=cfg.z_epochs,
        c_epochs=cfg.c_epochs,
        head_epochs=cfg.head_epochs,
        learning_rate=cfg.learning_rate,
        head_learning_rate=cfg.learning_rate if head_tunes_encoders else cfg.head_learning_rate,
        simulation=cfg.simulation,
        group_size=cfg.group_size,
    )
    model = model_fn()
    classify = tf.function(model.classify, input_signature=[tf.TensorSpec([None, *task.arch.image_shape])])
    to_weights = lambda arrays: training_loop.to_model_weights(arrays, process.private_state_type)
    store = _open_store(task, process, outputs)
    stopping = task.stopping()
    with store:

        def logits_for(weights):
            """`(client id, images) -> logits` with each client's stored private state (loaded once per client)."""
            states = dict(zip(task.data.client_ids, store.get(task.data.client_ids)))
            current: dict[str, str] = {}

            def logits(cid, images):
                if current.get('cid') != cid:
                    feddva.set_weights(model, weights, to_weights(states[cid]))
                    current['cid'] = cid
                return classify(images).numpy()

            return logits

        state, _ = program.run_process(
            process,
            cfg,
            outputs=outputs,
            client_data=task.train,
            dataset_fn=task.dataset_fn,
            evaluation_fn=lambda w: task.evaluate(logits_for(w)),
            name='feddva_tuned' if head_tunes_encoders else 'feddva',
            client_state_store=store,
            stopping=stopping,
        )
        weights = process.get_model_weights(state)
        row: dict[str, Any] = task.selected_row(outputs, stopping) if stopping else task.accuracy(logits_for(weights))
        states = dict(zip(task.data.client_ids, [to_weights(s) for s in store.get(task.data.client_ids)]))
    row['seconds_per_round'] = outputs.median_round_seconds()
    encodings = encode_clients(task, model, weights, states)
    row.update(local_logistic_heads(task, encodings))
    return row, {'model': model, 'weights': weights, 'states': states, 'encodings': encodings}


def _cnn_logits(model: tf.keras.Model, shape) -> Callable:
    return tf.function(lambda x: model(x, training=False), input_signature=[tf.TensorSpec([None, *shape])])


def run_fedavg(task: FeddvaTask, outputs: program.ExperimentOutputs, finetune: bool) -> dict[str, dict[str, Any]]:
    """FedAvg, and (if `finetune`) FedAvg + fine-tuning evaluated on the same FedAvg models."""
    cfg = task.config
    element_spec = task.element_spec

    def tff_model_fn():
        return tff.learning.models.from_keras_model(
            task.cnn_fn(),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            input_spec=element_spec,
            metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
        )

    process = tff.learning.algorithms.build_weighted_fed_avg(
        tff_model_fn,
        client_optimizer_fn=optimizers.build_optimizer('adam', cfg.learning_rate),
        server_optimizer_fn=optimizers.build_optimizer('sgd', 1.0),
    )
    model = task.cnn_fn()
    logits = _cnn_logits(model, task.data.image_shape)
    ft_optimizer = tff.learning.optimizers.build_adam(learning_rate=cfg.finetune_learning_rate)
    finetune_fn = tf.function(lambda ds: ditto.global_steps(model, ds, cfg.finetune_epochs, ft_optimizer))

    def evaluate(weights, with_ft: bool):
        weights.assign_weights_to(model)
        result = task.evaluate(lambda cid, x: logits(x).numpy())
        if with_ft:
            cache: dict[str, str] = {}  # The client whose fine-tuned weights the model holds.

            def ft_logits(cid, images):
                if cache.get('cid') != cid:
                    weights.assign_weights_to(model)
                    finetune_fn(task.dataset_fn(task.train.create_tf_dataset_for_client(cid)))
                    cache['cid'] = cid
                return logits(images).numpy()

            result.update({f'ft_{k}': v for k, v in task.evaluate(ft_logits).items()})
        return result

    def eval_fn(weights):
        return evaluate(weights, finetune)

    stopping = task.stopping()
    state, _ = program.run_process(
        process,
        cfg,
        outputs=outputs,
        client_data=task.train,
        dataset_fn=lambda d: task.dataset_fn(d.repeat(cfg.client_epochs)),
        evaluation_fn=eval_fn,
        name='fedavg',
        stopping=stopping,
    )
    spr = outputs.median_round_seconds()
    if stopping is not None:  # Each row at its own best validation round (fine-tuning's is its own).
        rows = {'fedavg': task.selected_row(outputs, stopping)}
        if finetune:
            rows['fedavg_ft'] = task.selected_row(outputs, None, prefix='ft_')
    else:
        final = evaluate(process.get_model_weights(state), finetune)
        rows = {'fedavg': {k: v for k, v in final.items() if not k.startswith('ft_')}}
        if finetune:
            rows['fedavg_ft'] = {k[3:]: v for k, v in final.items() if k.startswith('ft_')}
    for row in rows.values():
        row['seconds_per_round'] = spr
    return rows


def run_ditto(task: FeddvaTask, outputs: program.ExperimentOutputs) -> dict[str, Any]:
    """Ditto; the accuracy of every client's personal model."""
    cfg = task.config
    process = ditto.build_ditto(
        task.cnn_fn,
        element_spec=task.element_spec,
        lam=cfg.ditto_lambda,
        client_epochs=cfg.client_epochs,
        personal_epochs=cfg.client_epochs,
        client_optimizer=tff.learning.optimizers.build_adam(learning_rate=cfg.learning_rate),
        personal_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=cfg.ditto_personal_learning_rate),
        simulation=cfg.simulation,
        group_size=cfg.group_size,
    )
    model = task.cnn_fn()
    logits = _cnn_logits(model, task.data.image_shape)
    to_weights = lambda arrays: training_loop.to_model_weights(arrays, process.private_state_type)
    store = _open_store(task, process, outputs)
    with store:

        def personal_accuracy(_):
            states = dict(zip(task.data.client_ids, store.get(task.data.client_ids)))
            cache: dict[str, str] = {}  # The client whose private state the model holds.

            def fn(cid, images):
                if cache.get('cid') != cid:
                    to_weights(states[cid]).assign_weights_to(model)
                    cache['cid'] = cid
                return logits(images).numpy()

            return task.evaluate(fn)

        stopping = task.stopping()
        program.run_process(
            process,
            cfg,
            outputs=outputs,
            client_data=task.train,
            dataset_fn=task.dataset_fn,
            evaluation_fn=personal_accuracy,
            name='ditto',
            client_state_store=store,
            stopping=stopping,
        )
        row = task.selected_row(outputs, stopping) if stopping else personal_accuracy(None)
    row['seconds_per_round'] = outputs.median_round_seconds()
    return row


# A method's runner: `(task, outputs, method) -> ({method: row} of every row the run gives, FedDVA's analysis
# context or None)`. FedAvg's run also gives the fine-tuned row (fine-tuning evaluates the same FedAvg models).
_Rows = tuple[dict[str, dict[str, Any]], Any]


def _feddva_rows(task: FeddvaTask, outputs: program.ExperimentOutputs, method: str) -> _Rows:
    row, context = run_feddva(task, outputs, head_tunes_encoders=method == 'feddva_tuned')
    return {method: row}, context


def _fedavg_rows(task: FeddvaTask, outputs: program.ExperimentOutputs, method: str) -> _Rows:
    del method  # One run gives both rows.
    return run_fedavg(task, outputs, finetune='fedavg_ft' in task.config.configurations), None


def _ditto_rows(task: FeddvaTask, outputs: program.ExperimentOutputs, method: str) -> _Rows:
    return {method: run_ditto(task, outputs)}, None


RUNNERS: dict[str, Callable[[FeddvaTask, program.ExperimentOutputs, str], _Rows]] = {
    'feddva': _feddva_rows,
    'feddva_tuned': _feddva_rows,
    'fedavg': _fedavg_rows,
    'fedavg_ft': _fedavg_rows,
    'ditto': _ditto_rows,
}


def accuracy_curves(config: FeddvaConfig) -> tuple[dict[tuple[str, str], list[tuple[int, float]]], str]:
    """The runs' accuracy curves read from `config.output_dir` (validation accuracy when the rows select on
    validation, else test accuracy) and their figure, ``accuracy_vs_rounds.png`` there."""
    curves = load_curves(config.output_dir, config.settings, config.configurations)
    split = 'validation' if config.validation_per_client else 'test'
    path = plot_accuracy_curves(
        curves,
        os.path.join(config.output_dir, 'accuracy_vs_rounds.png'),
        title=f'{config.dataset}: {split} accuracy of every client',
        split=split,
    )
    return curves, path


def run(config: FeddvaConfig) -> dict[str, Any]:
    """Runs every configured setting and method; writes results.json and the figures to `config.output_dir`."""
    run_record.check_output_dir(config)  # Also when called directly; a binary has checked (same config).
    tf.random.set_seed(config.seed)
    program.write_json(os.path.join(config.output_dir, 'config.json'), dataclasses.asdict(config))
    source = federated_images.load_source(
        config.source_dataset,
        config.data_dir,
        generated_train=config.synthetic_train,
        generated_test=config.synthetic_test,
        seed=config.seed,
    )
    rows, analyses, statistics = [], {}, {}
    # The disentanglement evidence comes from the label-free FedDVA when it runs.
    analyzed = 'feddva' if 'feddva' in config.configurations else 'feddva_tuned'
    for setting in config.settings:
        data = load_setting(config, source, setting)
        statistics[setting] = data.statistics()
        logging.info('FedDVA data: %s; %s', data.description, statistics[setting])
        task = FeddvaTask(config, data)
        by_method: dict[str, dict[str, Any]] = {}
        for method in config.configurations:
            if method in by_method:
                continue
            outputs = program.ExperimentOutputs(config.output_dir, f'{setting}/{method}')
            started = time.time()
            method_rows, context = program.runner_for(RUNNERS, method, 'method')(task, outputs, method)
            by_method.update(method_rows)
            if context is not None and setting == config.disentanglement_setting and method == analyzed:
                analyses[setting] = analyze_disentanglement(task, context, os.path.join(config.output_dir, setting))
            logging.info('[%s/%s] done in %.0fs', setting, method, time.time() - started)
        for method in METHODS:
            if method in by_method and method in config.configurations:
                result = dict(by_method[method])
                rows.append(
                    {
                        'name': f'{METHOD_NAMES[method]} ({SETTING_NAMES[setting]})',
                        'method': method,
                        'setting': setting,
                        **result,
                    }
                )
    for setting, analysis in analyses.items():
        rows.append(
            {
                'name': f'FedDVA disentanglement ({SETTING_NAMES[setting]})',
                'method': analyzed,
                'setting': setting,
                **analysis['probes'],
            }
        )
    curves, curves_path = accuracy_curves(config)
    results = {
        'dataset': config.dataset,
        'statistics': statistics,
        'rows': rows,
        'curves': {f'{s}/{m}': c for (s, m), c in curves.items()},
        'figures': {
            'accuracy_vs_rounds': curves_path,
            **{f'{s}_{k}': v for s, a in analyses.items() for k, v in a['figures'].items()},
        },
        'rounds': config.total_rounds,
    }
    program.write_json(os.path.join(config.output_dir, 'results.json'), results)
    return results
