"""Value-level privacy audit of FURL and FedRecon (training rounds on both execution paths, FedRecon's evaluation,
and what the training loop writes), with private canaries planted in rows of the local embedding table.

What is private:

* FURL: each client's private parameters (the model's local variables, here a user table), a CLIENTS-placed input
  and output of every round kept on the client between rounds.
* FedRecon: the local variables a client reconstructs every round (here the same user table) from their initial
  values (the model's initializers) on its support data; they exist only inside the client's computation.

Both algorithms train on the private values the data touches (row 0 of the table), so the global update depends on
them by design. Rows 1.. of the table are never indexed by any example: they are *canaries*. The tests show that
perturbing only the canaries leaves every SERVER-placed output bit-identical (server state, round metrics,
evaluation metrics including the per-client ones; checkpoints and metrics.csv of the training loop) and that
neither the canary values nor their per-client or over-client sums and means appear in any of them.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import client_state
from fedpersonal import evaluation
from fedpersonal import models
from fedpersonal import program
from fedpersonal.privacy import value_audit
from fedpersonal.program import outputs as outputs_lib

NUM_ITEMS, DIM, ROWS, CLIENTS = 6, 3, 3, 3
ITEM_INIT = np.random.default_rng(0).normal(0.0, 0.3, size=[NUM_ITEMS, DIM]).astype(np.float32)
OTHER_BASE = 5003.5


class UserTable(tf.keras.layers.Layer):
    """A local table of `ROWS` user rows of which every example uses row 0 (rows 1.. are never indexed)."""

    def __init__(self, initial, **kwargs):
        super().__init__(**kwargs)
        self.initial = np.asarray(initial, np.float32)

    def build(self, input_shape):
        self.table = self.add_weight(
            name='table', shape=(ROWS, DIM), initializer=tf.keras.initializers.Constant(self.initial)
        )

    def call(self, inputs):
        return tf.gather(self.table, tf.zeros([tf.shape(inputs)[0]], tf.int32))


def table(client=0, base=value_audit.CANARY_BASE):
    """Row 0: a normal embedding; rows 1..: the canary pattern of `client`."""
    row0 = np.full([1, DIM], 0.1 + 0.05 * client, np.float32)
    return np.concatenate([row0, value_audit.canary_pattern([ROWS - 1, DIM], client=client, base=base)])


def model_fn_with(initial_table):
    def model_fn():
        item_input = tf.keras.Input(shape=[1], dtype=tf.int64)
        items = tf.keras.layers.Embedding(
            NUM_ITEMS, DIM, embeddings_initializer=tf.keras.initializers.Constant(ITEM_INIT)
        )
        user = UserTable(initial_table)
        pred = tf.keras.layers.Dot(axes=1)([tf.keras.layers.Flatten()(items(item_input)), user(item_input)])
        spec = collections.OrderedDict(x=tf.TensorSpec([None, 1], tf.int64), y=tf.TensorSpec([None, 1], tf.float32))
        return models.from_keras_model(
            tf.keras.Model(item_input, pred), input_spec=spec, global_layers=[items], local_layers=[user]
        )

    return model_fn


def dataset(client):
    items = (np.arange(5) + client) % NUM_ITEMS
    y = (1.0 + (items * (client + 2)) % 5).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=items[:, None], y=y[:, None])).batch(2)


DATA = [dataset(c) for c in range(CLIENTS)]


def private_states(base=value_audit.CANARY_BASE):
    return [tff.learning.models.ModelWeights(trainable=[table(c, base)], non_trainable=[]) for c in range(CLIENTS)]


def furl_canaries(states):
    return [np.asarray(s.trainable[0])[1:] for s in states]


def table_canaries(tables):
    return [t[1:] for t in tables]


def build_furl(simulation):
    return algorithms.build_furl(
        model_fn_with(table()),
        loss_fn=tf.keras.losses.MeanSquaredError,
        client_optimizer=tff.learning.optimizers.build_sgdm(0.1, momentum=0.9),
        private_norm_regularization=0.01,  # Shrinks the canary rows too, on the client.
        simulation=simulation,
    )


@pytest.mark.parametrize('simulation', ['engine', 'per_client'])
def test_furl_round(simulation):
    process = build_furl(simulation)
    state = process.initialize()
    report = value_audit.audit_round_values(
        lambda p: process.run_round(state, DATA, p),
        private_states(),
        private_states(OTHER_BASE),
        canaries=furl_canaries,
    )
    assert report.clean, report
    # Positive control of the perturbation: the private row 0 the data trains does change the global update.
    touched = private_states()
    touched[1].trainable[0][0] += 0.5
    changed = value_audit.changed_outputs(
        report.outputs,
        value_audit.server_outputs(process.run_round(state, DATA, touched)),
    )
    assert any(path.startswith('state/') for path in changed) and any(path.startswith('metrics/') for path in changed)


def test_furl_training_loop_files(tmp_path):
    """Two 2-round runs whose clients' stored private states differ only in the canaries: the same metrics.csv
    (time columns aside) and checkpoint, and no canary value in any file of the output directory."""
    process = build_furl('engine')
    template = program.flatten_private_state(process.initial_private_state())
    spec = client_state.spec_of(template)
    finals, rows = [], []
    for base in (value_audit.CANARY_BASE, OTHER_BASE):
        initial = {str(c): program.flatten_private_state(s) for c, s in enumerate(private_states(base))}
        store = client_state.InMemoryClientStateStore(spec, lambda cid, initial=initial: initial[cid])
        outputs = program.ExperimentOutputs(str(tmp_path / str(base)), 'run')
        state, _ = program.run_learning_process(
            process, client_data=DATA, total_rounds=2, outputs=outputs, client_state_store=store, name=str(base)
        )
        sightings = value_audit.file_sightings(outputs.directory, furl_canaries(private_states(base)))
        assert sightings == [], sightings
        loaded, version = outputs_lib.run_coroutine(outputs.state_manager.load_latest(process.initialize()))
        assert int(version) == 2
        finals.append({**value_audit.flatten(state, 'final'), **value_audit.flatten(loaded, 'checkpoint')})
        rows.append([{k: v for k, v in row.items() if 'seconds' not in k} for row in outputs.read_metrics()])
        # The canaries stayed on the clients (shrunk by the norm penalty there).
        stored = store.get([str(c) for c in range(CLIENTS)])
        assert all(np.abs(s[0][1:]).min() > 1000 for s in stored)
    assert value_audit.changed_outputs(*finals) == []
    assert rows[0] == rows[1] and len(rows[0]) == 2


def build_fed_recon(initial_table, simulation):
    return algorithms.build_fed_recon(
        model_fn_with(initial_table),
        loss_fn=tf.keras.losses.MeanSquaredError,
        jointly_train_locals=True,  # Locals are trained in both phases.
        dataset_split=algorithms.ReconstructionSplit(recon_epochs=2),
        simulation=simulation,
    )


@pytest.mark.parametrize('simulation', ['engine', 'per_client'])
def test_fed_recon_round(simulation):
    """FedRecon holds no private state between rounds: a client's local variables start from the model's
    initializers, so the canaries are planted in the initial values of the untouched rows (the same for every
    client of a run; each run uses its own model function)."""
    processes = {base: build_fed_recon(table(0, base), simulation) for base in (value_audit.CANARY_BASE, OTHER_BASE)}
    state = processes[value_audit.CANARY_BASE].initialize()
    report = value_audit.audit_round_values(
        lambda base: processes[base].run_round(state, DATA),
        value_audit.CANARY_BASE,
        OTHER_BASE,
        canaries=lambda base: table_canaries([table(0, base)]),
    )
    assert report.clean, report
    # Positive control: the initial value of row 0, which reconstruction starts from, reaches the global update.
    touched = table()
    touched[0] += 0.5
    changed = value_audit.changed_outputs(
        report.outputs,
        value_audit.server_outputs(build_fed_recon(touched, simulation).run_round(state, DATA)),
    )
    assert any(path.startswith('state/') for path in changed)


@pytest.mark.parametrize('simulation', ['engine', 'per_client'])
def test_fed_recon_evaluation(simulation):
    """`build_recon_eval`'s outputs (aggregate and per-client metrics) after reconstructing the locals."""
    evaluations = {
        base: evaluation.build_recon_eval(
            model_fn_with(table(0, base)),
            loss_fn=tf.keras.losses.MeanSquaredError,
            dataset_split=algorithms.ReconstructionSplit(recon_epochs=2),
            simulation=simulation,
        )
        for base in (value_audit.CANARY_BASE, OTHER_BASE)
    }
    weights = build_fed_recon(table(), 'per_client')
    weights = weights.get_model_weights(weights.initialize())
    report = value_audit.audit_round_values(
        lambda base: evaluations[base](weights, DATA),
        value_audit.CANARY_BASE,
        OTHER_BASE,
        canaries=lambda base: table_canaries([table(0, base)]),
    )
    assert report.clean, report
    outputs = value_audit.server_outputs(evaluations[OTHER_BASE](weights, DATA))
    assert any(path.startswith('per_client/') for path in outputs)
