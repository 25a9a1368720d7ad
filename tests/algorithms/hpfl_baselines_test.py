"""HPFL baselines on the GUM: server updates against numpy (FedAvg, FedAtt, FedSGD), FedProx, Fednoise, privacy."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms import hpfl
from fedpersonal.algorithms.hpfl import baselines as hpfl_baselines
from fedpersonal.data import user_modeling as um
from fedpersonal.models import gum
from fedpersonal.privacy import audit
from tests import tolerances

K, H = 3, 2
# GUM's gradient of the public weights: the forward pass's sums (attributes @ relative_M, (theta * qm) @ skill_W,
# the mean over K) and the backward pass's (as many again), with the sigmoids' and products' roundings.
GUM_GRADIENT_DEPTH = 2 * (3 * K) + 6


def make_data(seed=0):
    rng = np.random.default_rng(seed)
    silos = []
    for c, (nu, ni, n) in enumerate(((5, 6, 12), (7, 8, 10), (4, 5, 14))):
        attributes = np.zeros((ni, K), np.float32)
        attributes[np.arange(ni), rng.integers(0, K, ni)] = 1
        user = np.repeat(np.arange(nu), n)
        item = rng.integers(0, ni, user.size)
        item[:ni] = np.arange(ni)
        label = (rng.random(user.size) < 0.3 + 0.4 * (user % 2)).astype(np.float32)
        silos.append(
            um.ClientSilo(
                client_id=f's{c}',
                num_users=nu,
                num_items=ni,
                user=user.astype(np.int64),
                item=item.astype(np.int64),
                label=label,
                split=um.per_user_split(user),
                item_attributes=attributes,
                global_user_ids=np.arange(nu, dtype=np.int64) + 10 * c,
                global_item_ids=np.arange(ni, dtype=np.int64),
            )
        )
    return um.validate(
        um.UserModelingData(
            name='tiny',
            task='binary',
            num_attributes=K,
            attribute_names=['a', 'b', 'c'],
            rating_range=(0.0, 1.0),
            silos=silos,
            source='test',
        )
    )


DATA = make_data()
CONFIG = gum.GumConfig.for_data(DATA, hidden_dim=H)
CLIENT_DATA = hpfl.federated_data(DATA, CONFIG, batch_size=8)
INITIAL = hpfl.initial_client_states(DATA, CONFIG)


@pytest.fixture(scope='module')
def local_round():
    """Each client's locally trained state and report from the initial states (the Distributed baseline's client)."""
    process = hpfl_baselines.build_distributed(CONFIG, client_epochs=2)
    outputs = [process.parts['client_update']((), d, s) for d, s in zip(CLIENT_DATA, INITIAL)]  # Receives nothing.
    return process, [(trained, report) for _, report, trained in outputs]


def _public(state):
    return [np.asarray(v) for v in state.global_model_weights.trainable]


def test_fedavg_is_the_weighted_mean_of_local_models(local_round):
    _, local = local_round
    process = hpfl_baselines.build_fedavg(CONFIG, client_epochs=2)
    out = process.next(process.initialize(), CLIENT_DATA, INITIAL)
    weights = np.array([r.num_train_examples for _, r in local])
    for i, value in enumerate(_public(out.state)):
        expected = sum(w * np.asarray(t.model.public[i]) for w, (t, _) in zip(weights, local)) / weights.sum()
        # The local models are the fixture's exactly (below); the weighted mean over the 3 clients reordered: the
        # weights' products, the 3 terms' sum, the division.
        tolerances.assert_reordered_close(value, expected, depth=1 + 3 + 1)
    for (trained, _), new in zip(local, out.private_states):
        # Stays local: the same local training on the same inputs, exactly.
        np.testing.assert_array_equal(new.model.private.theta, trained.model.private.theta)
        for a, b in zip(new.model.public, _public(out.state)):
            np.testing.assert_array_equal(a, b)  # Clients now predict with the new global public components.


def test_fedatt_is_layerwise_attentive_aggregation(local_round):
    _, local = local_round
    eps = 0.5
    process = hpfl_baselines.build_fedatt(CONFIG, client_epochs=2, attention_step=eps)
    initial = process.initialize()
    out = process.next(initial, CLIENT_DATA, INITIAL)
    for i, (w, value) in enumerate(zip(_public(initial), _public(out.state))):
        clients = [np.asarray(t.model.public[i]) for t, _ in local]
        d = np.array([np.linalg.norm(w - c) for c in clients])
        alpha = np.exp(-d) / np.exp(-d).sum()
        # The distance's sum over the tensor's (at most K * K) entries, the softmax's sum over the 3 clients and
        # the exp and division, the weighted sum over the 3 clients, the step's roundings.
        tolerances.assert_reordered_close(
            value, w - eps * sum(a * (w - c) for a, c in zip(alpha, clients)), depth=K * K + 3 + 2 + 3 + 2
        )


def test_fedsgd_applies_the_mean_gradient():
    lr = 0.3
    process = hpfl_baselines.build_fedsgd(CONFIG, server_optimizer=tff.learning.optimizers.build_sgdm(lr))
    initial = process.initialize()
    out = process.next(initial, CLIENT_DATA, INITIAL)
    grads, counts = [], []
    for silo, state in zip(DATA.silos, INITIAL):
        keep = silo.split == um.SPLIT_TRAIN
        public = [tf.constant(v) for v in state.model.public]
        with tf.GradientTape() as tape:
            tape.watch(public)
            weights = state.model._replace(public=gum.PublicWeights(*public))
            loss = gum.mse_loss(
                weights,
                tf.constant(silo.user[keep]),
                tf.constant(silo.item[keep]),
                tf.constant(silo.item_attributes[silo.item[keep]]),
                tf.constant(silo.label[keep]),
            )
        grads.append([g.numpy() for g in tape.gradient(loss, public)])
        counts.append(keep.sum())
    counts = np.array(counts, np.float64)
    for i, (w, value) in enumerate(zip(_public(initial), _public(out.state))):
        mean_grad = sum(n * g[i] for n, g in zip(counts, grads)) / counts.sum()
        # The step itself (some tensors' steps are ~1e-5, below the weights' own rounding scale): a client's gradient
        # sums over its (at most 70) training examples, then the weighted mean over 3 clients, on the step's scale;
        # reading the step back as value - w adds the server's rounding at the weights' scale.
        step = -lr * mean_grad
        depth = GUM_GRADIENT_DEPTH + 70 + 3
        bound = tolerances.reorder_bound(depth=depth, scale=float(np.abs(step).max())) + 2 * tolerances.U32 * float(
            np.abs(w).max()
        )
        assert np.abs(step).max() > 10 * bound  # A real step, well beyond the bound.
        np.testing.assert_allclose(value - w, step, rtol=0, atol=bound)
    assert not np.allclose(out.private_states[0].model.private.theta, INITIAL[0].model.private.theta)


def test_fedprox_stays_closer_to_the_global_model():
    distances = {}
    for name, process in (
        ('fedavg', hpfl_baselines.build_fedavg(CONFIG, client_epochs=3)),
        ('fedprox', hpfl_baselines.build_fedprox(CONFIG, client_epochs=3, proximal_strength=50.0)),
    ):
        initial = process.initialize()
        out = process.next(initial, CLIENT_DATA, INITIAL)
        distances[name] = sum(np.linalg.norm(a - b) for a, b in zip(_public(initial), _public(out.state)))
    assert distances['fedprox'] < 0.5 * distances['fedavg']


def test_fednoise_adds_seeded_gaussian_noise_to_uploads():
    std = 0.05
    fedavg = hpfl_baselines.build_fedavg(CONFIG)
    fednoise = hpfl_baselines.build_fednoise(CONFIG, noise_stddev=std)
    clean = _public(fedavg.next(fedavg.initialize(), CLIENT_DATA, INITIAL).state)
    noisy = [_public(fednoise.next(fednoise.initialize(), CLIENT_DATA, INITIAL).state) for _ in range(2)]
    for a, b in zip(*noisy):
        np.testing.assert_array_equal(a, b)  # Seeded by the client seed and the round: reproducible.
    difference = np.concatenate([(n - c).ravel() for n, c in zip(noisy[0], clean)])
    weights = np.array([np.sum(s.split == um.SPLIT_TRAIN) for s in DATA.silos], np.float64)
    expected_std = std * np.sqrt(np.sum((weights / weights.sum()) ** 2))  # Weighted mean of independent noises.
    assert 0.5 * expected_std < difference.std() < 1.6 * expected_std


@pytest.mark.parametrize('method', hpfl_baselines.BASELINES)
def test_private_tables_never_reach_the_server(method):
    process = hpfl_baselines.build_baseline(method, CONFIG)
    signature = process.next.type_signature
    assert signature.parameter[2].placement is tff.CLIENTS and signature.result.private_states.placement is tff.CLIENTS
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match='method must be one of'):
        hpfl_baselines.build_baseline('fedbn', CONFIG)


# ------------------------------------------------------------------------------------ one builder, one protocol
def test_every_method_is_a_configuration_of_one_personalized_process():
    from fedpersonal import core  # pylint: disable=g-import-not-at-top

    initial_public = [np.asarray(v) for v in INITIAL[0].model.public]
    for method in hpfl.BASELINES + hpfl.HPFL_VARIANTS:
        process = hpfl.build_method(method, CONFIG)
        assert isinstance(process, core.PersonalizedProcess) and process.stateful, method
        assert process.parts['spec'] == hpfl.round_spec(method) and process.parts['name'] == method
        assert process.private_state_type == hpfl.client_state_type(CONFIG)
        assert process.next.type_signature.result.python_container is core.ProcessOutput
        template = process.initial_private_state()
        assert int(template.num_users) == 0 and int(template.num_items) == 0
        state = process.initialize()
        for got, expected in zip(process.get_model_weights(state).trainable, initial_public):
            np.testing.assert_array_equal(got, expected)  # The global public components, as TFF ModelWeights.
        # The FedAvg family starts from a broadcast; HPFL and Distributed train their own model, so their only
        # broadcast (if any) is the one after aggregation.
        broadcasts = str(process.next.to_building_block()).count('federated_broadcast')
        fedavg_family = method in ('fedsgd', 'fedavg', 'fednoise', 'fedprox', 'fedatt')
        assert broadcasts == int(fedavg_family) + int(process.parts['spec'].personalizes), method


def test_round_spec_rejects_inconsistent_rounds():
    with pytest.raises(ValueError, match="start='global' goes with an update aggregation"):
        hpfl.RoundSpec(public_aggregation='mean')
    with pytest.raises(ValueError, match="need start='global'"):
        hpfl.RoundSpec(proximal_strength=0.1)
    with pytest.raises(ValueError, match='public_aggregation must be one of'):
        hpfl.RoundSpec(public_aggregation='median')
    with pytest.raises(ValueError, match='model_aggregator applies'):
        hpfl.build_process(CONFIG, hpfl.round_spec('fedatt'), model_aggregator=tff.aggregators.MeanFactory())
