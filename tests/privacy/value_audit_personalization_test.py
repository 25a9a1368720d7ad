"""Value-level privacy audit of Ditto, FedDVA and HPFL: rounds on the fast engine (`run_round`) and on TFF's
per-client computation (`next`), each run twice with the same server state and data but perturbed private states.

What is private, and what the tests show:

* Ditto: each client's personal model v_k (its whole private state). The global model's training never reads v_k,
  so perturbing *every* personal weight leaves the server state bit-identical; of the round's metrics only the
  personal model's own training statistics (``personal_loss``, ``personal_accuracy``: summed over clients, then
  divided) change. No personal weight, nor a client's or the clients' sum or mean of them, appears in any output.
* FedDVA: each client's decoder, classifier head and batch-norm statistics. The encoders (federated) are trained
  through the decoder, so the decoder reaches the global update by design; the head is trained only in the head
  phase: without it (``head_epochs=0``) the head weights are canaries, and perturbing them leaves every
  SERVER-placed output bit-identical and never appears there.
* HPFL: each silo's GUM (public copy and private user/item tables) and table sizes. The tables reach the server
  only through the uploaded k-means centres of the silo's *real* rows (by design, `fedpersonal.algorithms.hpfl`);
  the padded rows past a silo's real users and items are canaries: perturbing them leaves every SERVER-placed
  output bit-identical and never appears there.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms import ditto
from fedpersonal.algorithms import feddva
from fedpersonal.algorithms import hpfl
from fedpersonal.data import user_modeling as um
from fedpersonal.models import feddva_models as fm
from fedpersonal.models import gum
from fedpersonal.privacy import value_audit

OTHER_BASE = 5003.5
RNG = np.random.default_rng(3)


# ------------------------------------------------------------------------------------------------------------ Ditto
def linear_model():
    x = tf.keras.Input([2])
    return tf.keras.Model(x, tf.keras.layers.Dense(3, kernel_initializer=tf.keras.initializers.Constant(0.1))(x))


def ditto_data(client):
    x = RNG.normal(size=[6, 2]).astype(np.float32) if client >= 0 else None
    y = (np.arange(6) + client) % 3
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y.astype(np.int32))).batch(3)


DITTO_DATA = [ditto_data(c) for c in range(3)]


def personal_models(base):
    """Every personal weight a canary (kernel [2, 3] and bias [3], client-specific)."""
    return [
        tff.learning.models.ModelWeights(
            trainable=[
                value_audit.canary_pattern([2, 3], client=c, base=base),
                value_audit.canary_pattern([3], client=c, base=base + 10),
            ],
            non_trainable=[],
        )
        for c in range(3)
    ]


def flat_personal(states):
    return [np.concatenate([np.ravel(w) for w in s.trainable]) for s in states]


@pytest.mark.parametrize('simulation', ['engine', 'per_client'])
def test_ditto_server_state_never_depends_on_personal_models(simulation):
    process = ditto.build_ditto(
        linear_model, element_spec=DITTO_DATA[0].element_spec, lam=0.1, personal_epochs=1, simulation=simulation
    )
    state = process.initialize()
    report = value_audit.audit_round_values(
        lambda p: process.run_round(state, DITTO_DATA, p),
        personal_models(value_audit.CANARY_BASE),
        personal_models(OTHER_BASE),
        canaries=flat_personal,
    )
    assert report.sightings == []
    assert report.changed and all(
        path.startswith(('metrics/client_work/train/personal_loss', 'metrics/client_work/train/personal_accuracy'))
        for path in report.changed
    ), report.changed

    # Without personal epochs the personal models are not even read: every server output is bit-identical.
    untouched = ditto.build_ditto(
        linear_model, element_spec=DITTO_DATA[0].element_spec, personal_epochs=0, simulation=simulation
    )
    report = value_audit.audit_round_values(
        lambda p: untouched.run_round(state, DITTO_DATA, p),
        personal_models(value_audit.CANARY_BASE),
        personal_models(OTHER_BASE),
        canaries=flat_personal,
    )
    assert report.clean, report


# ----------------------------------------------------------------------------------------------------------- FedDVA
TINY = fm.DvaArchitecture(
    image_shape=(8, 8, 1),
    z_dim=2,
    c_dim=2,
    encoder_channels=(3, 4),
    decoder_dense=(7,),
    decoder_channels=(3, 2),
    num_classes=3,
)


def dva_data(seed, n=8):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=[n, 8, 8, 1]).astype(np.float32)
    y = rng.integers(0, 3, size=n).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(4)


DVA_DATA = [dva_data(c) for c in range(2)]


def num_head_variables():
    with tf.Graph().as_default():
        return len(fm.DualVae(TINY).head_variables)


def with_head_canaries(process, base):
    """Initial private states whose classifier-head weights (the last trainable private variables) are canaries."""
    heads = num_head_variables()
    states = []
    for c in range(len(DVA_DATA)):
        state = process.initial_private_state()
        trainable = list(state.trainable)
        for i in range(len(trainable) - heads, len(trainable)):
            shape = np.shape(trainable[i])
            trainable[i] = value_audit.canary_pattern(shape, client=c, base=base + 1000 * i)
        states.append(tff.learning.models.ModelWeights(trainable=trainable, non_trainable=list(state.non_trainable)))
    return states


def head_canaries(states):
    heads = num_head_variables()
    return [np.concatenate([np.ravel(w) for w in list(s.trainable)[-heads:]]) for s in states]


@pytest.mark.parametrize('simulation', ['engine', 'per_client'])
def test_feddva_head_canaries_never_reach_the_server(simulation):
    process = feddva.build_feddva(
        lambda: fm.DualVae(TINY),
        element_spec=DVA_DATA[0].element_spec,
        head_epochs=0,
        learning_rate=1e-2,
        simulation=simulation,
    )
    state = process.initialize()
    report = value_audit.audit_round_values(
        lambda p: process.run_round(state, DVA_DATA, p),
        with_head_canaries(process, value_audit.CANARY_BASE),
        with_head_canaries(process, OTHER_BASE),
        canaries=head_canaries,
    )
    assert report.clean, report
    # Positive control: the decoder, which the encoders train through, reaches the global update by design.
    states = with_head_canaries(process, value_audit.CANARY_BASE)
    moved = [tff.learning.models.ModelWeights(list(s.trainable), list(s.non_trainable)) for s in states]
    moved[0].trainable[0] = np.asarray(moved[0].trainable[0]) + 0.1
    changed = value_audit.changed_outputs(
        report.outputs,
        value_audit.server_outputs(process.run_round(state, DVA_DATA, moved)),
    )
    assert any(path.startswith('state/') for path in changed)


# ------------------------------------------------------------------------------------------------------------- HPFL
K = 3
SILO_USERS, SILO_ITEMS = (6, 8, 6), (7, 9, 7)  # Silos 0 and 2 have padded rows: users 6..7, items 7..8.


def hpfl_data():
    rng = np.random.default_rng(0)
    silos = []
    for c, (nu, ni) in enumerate(zip(SILO_USERS, SILO_ITEMS)):
        attributes = np.zeros((ni, K), np.float32)
        attributes[np.arange(ni), rng.integers(0, K, ni)] = 1
        user = np.repeat(np.arange(nu), 10)
        item = rng.integers(0, ni, user.size)
        item[:ni] = np.arange(ni)
        label = (rng.random(user.size) < 0.5).astype(np.float32)
        silos.append(
            um.ClientSilo(
                client_id=f'silo_{c}',
                num_users=nu,
                num_items=ni,
                user=user.astype(np.int64),
                item=item.astype(np.int64),
                label=label,
                split=um.per_user_split(user),
                item_attributes=attributes,
                global_user_ids=np.arange(nu, dtype=np.int64) + 100 * c,
                global_item_ids=np.arange(ni, dtype=np.int64),
            )
        )
    return um.validate(
        um.UserModelingData(
            name='tiny',
            task='binary',
            num_attributes=K,
            attribute_names=[f'a{k}' for k in range(K)],
            rating_range=(0.0, 1.0),
            silos=silos,
            source='value_audit_personalization_test.hpfl_data',
        )
    )


HPFL_DATA = hpfl_data()
CONFIG = gum.GumConfig.for_data(HPFL_DATA, hidden_dim=2)
CANARY_SILOS = (0, 2)


def with_padded_canaries(base):
    """Initial client states whose padded user and item rows (past the silo's real sizes) hold canaries."""
    states = hpfl.initial_client_states(HPFL_DATA, CONFIG)
    out = []
    for c, state in enumerate(states):
        private = state.model.private
        if c in CANARY_SILOS:
            nu, ni = SILO_USERS[c], SILO_ITEMS[c]
            theta, difficulty = np.array(private.theta), np.array(private.difficulty)
            slip, guess = np.array(private.slip), np.array(private.guess)
            theta[nu:] = value_audit.canary_pattern(theta[nu:].shape, client=c, base=base)
            difficulty[ni:] = value_audit.canary_pattern(difficulty[ni:].shape, client=c, base=base + 50)
            slip[ni:] = value_audit.canary_pattern(slip[ni:].shape, client=c, base=base + 80)
            guess[ni:] = value_audit.canary_pattern(guess[ni:].shape, client=c, base=base + 90)
            private = private._replace(theta=theta, difficulty=difficulty, slip=slip, guess=guess)
        out.append(state._replace(model=state.model._replace(private=private)))
    return out


def padded_canaries(states):
    found = []
    for c in CANARY_SILOS:
        private, nu, ni = states[c].model.private, SILO_USERS[c], SILO_ITEMS[c]
        parts = [private.theta[nu:], private.difficulty[ni:], private.slip[ni:], private.guess[ni:]]
        found.append(np.concatenate([np.ravel(p) for p in parts]))
    return found


def test_hpfl_canaries_have_one_shape():
    assert CONFIG.max_users == 8 and CONFIG.max_items == 9
    shapes = {c.shape for c in padded_canaries(with_padded_canaries(value_audit.CANARY_BASE))}
    assert len(shapes) == 1  # So the audit also searches their sums and means over silos.


@pytest.mark.parametrize('simulation', ['engine', 'per_client'])
def test_hpfl_padded_rows_never_reach_the_server(simulation):
    process = hpfl.build_hpfl(
        CONFIG,
        accuracy_threshold=0.4,
        client_epochs=1,
        max_clients=4,
        max_local_clusters=3,
        max_global_clusters=3,
        kmeans_iterations=2,
        simulation=simulation,
    )
    data = hpfl.federated_data(HPFL_DATA, CONFIG, batch_size=16)
    state = process.initialize()
    report = value_audit.audit_round_values(
        lambda p: process.run_round(state, data, p),
        with_padded_canaries(value_audit.CANARY_BASE),
        with_padded_canaries(OTHER_BASE),
        canaries=padded_canaries,
    )
    assert report.clean, report
    # Positive control: a real user's row reaches the server through the uploaded centres (by design).
    states = with_padded_canaries(value_audit.CANARY_BASE)
    theta = np.array(states[0].model.private.theta)
    theta[0] += 3.0
    private = states[0].model.private._replace(theta=theta)
    moved = [states[0]._replace(model=states[0].model._replace(private=private))] + states[1:]
    changed = value_audit.changed_outputs(
        report.outputs,
        value_audit.server_outputs(process.run_round(state, data, moved)),
    )
    assert any(path.startswith('state/') for path in changed)
