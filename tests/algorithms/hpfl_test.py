"""HPFL: aggregation and update formulas against numpy, k-means against numpy Lloyd, training, ablations, privacy."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms import hpfl
from fedpersonal.data import user_modeling as um
from fedpersonal.models import gum
from fedpersonal.privacy import audit
from tests import tolerances

K, H = 4, 2
# The numpy references compute in float32 too (NEP 50: Python floats do not widen float32 arrays), in another order.
# A centre-weighted embedding (global_embedding): the distance's sum over the 4 (or 3) coordinates, the weights' sum
# over the 4 centres, the weighted sum of the centres, and the square root, division and blend's roundings.
EMBEDDING_DEPTH = K + 4 + 4 + 3
# GUM's prediction: attributes @ relative_M, (theta * qm) @ skill_W, the mean over the K skills, and the sigmoids'
# and products' roundings (gum.predict).
GUM_DEPTH = 3 * K + 6
SMALL = dict(max_clients=4, max_local_clusters=4, max_global_clusters=4, kmeans_iterations=3)


def make_data(seed=0, users=(8, 12, 10), items=(10, 14, 12), records_per_user=20, missing=((2, 3),)):
    """Three non-IID silos; silo 2 lacks attribute 3. Labels follow a logistic proficiency-minus-difficulty model."""
    rng = np.random.default_rng(seed)
    missing = dict(missing)
    silos = []
    for c, (nu, ni) in enumerate(zip(users, items)):
        allowed = [a for a in range(K) if a != missing.get(c, -1)]
        attributes = np.zeros((ni, K), np.float32)
        for i in range(ni):
            attributes[i, rng.choice(allowed, size=rng.integers(1, 3), replace=False)] = 1
        proficiency, difficulty = rng.normal(0, 1.5, (nu, K)), rng.normal(0, 1, ni)
        user = np.repeat(np.arange(nu), records_per_user)
        item = np.concatenate([rng.permutation(np.resize(rng.permutation(ni), records_per_user)) for _ in range(nu)])
        item[:ni] = np.arange(ni)
        score = (attributes[item] * proficiency[user]).sum(1) / attributes[item].sum(1) - difficulty[item]
        label = (rng.random(user.size) < 1 / (1 + np.exp(-3 * score))).astype(np.float32)
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
            source='hpfl_test.make_data',
        )
    )


DATA = make_data()
CONFIG = gum.GumConfig.for_data(DATA, hidden_dim=H)


@pytest.fixture(scope='module')
def process():
    return hpfl.build_hpfl(CONFIG, accuracy_threshold=0.6, client_epochs=2, **SMALL)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ------------------------------------------------------------------------------------------ numpy references
def np_public_aggregation(previous, publics, accuracies, iterations, p):
    prev = np.concatenate(previous, axis=1)
    vectors = [np.concatenate(c, axis=1) for c in publics]
    out = prev.copy()
    for k in range(prev.shape[0]):
        weights = [float(acc[k] > np.float32(p)) * it[k] * acc[k] for acc, it in zip(accuracies, iterations)]
        if sum(weights) > 0:
            out[k] = sum(w * v[k] for w, v in zip(weights, vectors)) / sum(weights)
    return out


def np_global_embedding(emb, centres, centre_mask, weighting):
    out = []
    for e in emb:
        d = np.linalg.norm(e[None] - centres, axis=1)
        w = (d if weighting == 'distance' else 1 / np.maximum(d, 1e-6)) * centre_mask
        out.append(w @ centres / w.sum() if w.sum() > 0 else e)
    return np.array(out)


def np_maximin(points, mask, k, max_k):
    valid = np.flatnonzero(mask)
    k = min(k, max_k, valid.size)
    centres, centre_mask = np.zeros((max_k, points.shape[1])), np.zeros(max_k)
    if k == 0:
        return centres, centre_mask
    mean = points[valid].mean(0)
    first = valid[np.argmin(((points[valid] - mean) ** 2).sum(1))]
    chosen = [first]
    nearest = np.where(mask, ((points - points[first]) ** 2).sum(1), -np.inf)
    while len(chosen) < k:
        chosen.append(int(np.argmax(nearest)))
        nearest = np.where(mask, np.minimum(nearest, ((points - points[chosen[-1]]) ** 2).sum(1)), -np.inf)
    centres[:k], centre_mask[:k] = points[chosen], 1
    return centres, centre_mask


def np_lloyd(points, mask, centres, centre_mask):
    d2 = ((points[:, None, :] - centres[None]) ** 2).sum(-1)
    d2[:, centre_mask == 0] = np.inf
    assignment = d2.argmin(1)
    new = centres.copy()
    for j in np.flatnonzero(centre_mask):
        members = mask.astype(bool) & (assignment == j)
        if members.any():
            new[j] = points[members].mean(0)
    return new


def np_kmeans(points, mask, k, max_k, iterations):
    centres, centre_mask = np_maximin(points, mask, k, max_k)
    for _ in range(iterations):
        centres = np_lloyd(points, mask, centres, centre_mask)
    return centres, centre_mask


# ------------------------------------------------------------------------------------------------- formulas
def test_public_aggregation_matches_the_formula(process):
    rng = np.random.default_rng(0)
    previous = gum.PublicWeights(*[rng.normal(size=s).astype(np.float32) for s in ((K, H), (K, H), (K, K))])
    publics = [
        gum.PublicWeights(*[rng.normal(size=s).astype(np.float32) for s in ((K, H), (K, H), (K, K))]) for _ in range(3)
    ]
    accuracies = [
        np.array(a, np.float32) for a in ([0.9, 0.5, 0.7, 0.8], [0.8, 0.6, 0.65, 0.0], [0.61, 0.55, 0.9, 0.95])
    ]
    # Client 1 lacks attribute 3 (no records: Acc = I = 0); it passes p on attribute 2 but did no iteration there.
    # Attribute 1: 0.5, 0.6 (= p, not > p) and 0.55: nobody passes, so the previous global row stays.
    iterations = [np.array(i, np.float32) for i in ([10, 4, 6, 2], [5, 8, 0, 0], [7, 3, 2, 9])]
    got = process.parts['public_aggregation'](previous, publics, accuracies, iterations)
    expected = np_public_aggregation(previous, publics, accuracies, iterations, p=0.6)
    # A weighted mean over the 3 clients: the weights' products (2 roundings) and sum (3), the weighted sum (3) and
    # the division.
    tolerances.assert_reordered_close(np.asarray(gum.attribute_vectors(got)), expected, depth=2 + 3 + 3 + 1)
    vectors = [np.asarray(gum.attribute_vectors(c)) for c in publics]
    np.testing.assert_array_equal(expected[1], np.asarray(gum.attribute_vectors(previous))[1])  # Kept as it was.
    # The same weighted means written out with Python's (float64) weights: their float32 roundings, the 2 terms' sum
    # and the division.
    tolerances.assert_reordered_close(
        expected[3], (2 * 0.8 * vectors[0][3] + 9 * 0.95 * vectors[2][3]) / (1.6 + 8.55), depth=2 + 3 + 3 + 1
    )
    tolerances.assert_reordered_close(
        expected[2], (6 * 0.7 * vectors[0][2] + 2 * 0.9 * vectors[2][2]) / (4.2 + 1.8), depth=2 + 3 + 3 + 1
    )


@pytest.mark.parametrize('weighting', hpfl.CENTER_WEIGHTINGS)
def test_fine_grained_update_matches_numpy(weighting):
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(7, 3)).astype(np.float32)
    centres = rng.normal(size=(4, 3)).astype(np.float32)
    centre_mask = np.array([1, 1, 0, 1], np.float32)  # Slot 2 is padding: it must weigh nothing.
    row_mask = np.array([1, 1, 1, 1, 1, 0, 0], bool)
    accuracy = np.float32(0.7)
    global_emb = np_global_embedding(emb, centres, centre_mask, weighting)
    tolerances.assert_reordered_close(
        hpfl.global_embedding(emb, centres, centre_mask, weighting), global_emb, depth=EMBEDDING_DEPTH
    )
    expected = np.where(row_mask[:, None], accuracy * emb + (1 - accuracy) * global_emb, emb)
    got = hpfl.personalize_embeddings(emb, row_mask, centres, centre_mask, accuracy, weighting)
    tolerances.assert_reordered_close(got, expected, depth=EMBEDDING_DEPTH)
    # The published weighting pulls towards the farther centres, the inverse one towards the nearest.
    d = np.linalg.norm(emb[0] - centres, axis=1)
    d[2] = np.nan
    nearest, farthest = np.nanargmin(d), np.nanargmax(d)
    closer = np.linalg.norm(global_emb[0] - centres[nearest]) < np.linalg.norm(global_emb[0] - centres[farthest])
    assert closer == (weighting == 'inverse_distance')

    local = gum.PublicWeights(*[rng.normal(size=s).astype(np.float32) for s in ((K, H), (K, H), (K, K))])
    glob = gum.PublicWeights(*[rng.normal(size=s).astype(np.float32) for s in ((K, H), (K, H), (K, K))])
    acc_k = np.array([0.9, 0.0, 0.5, 1.0], np.float32)
    got = hpfl.personalize_public(local, glob, acc_k)
    for l, g, r in zip(local, glob, got):  # noqa: E741  (l: local, as in the paper's formula)
        # Element-wise, no sum: its three operations may round differently (another formula, an FMA).
        tolerances.assert_reordered_close(r, acc_k[:, None] * l + (1 - acc_k[:, None]) * g, depth=3)


def test_client_update_computation_applies_both_formulas(process):
    rng = np.random.default_rng(2)
    state = hpfl.initial_client_state(CONFIG, 9, 11, private_seed=3)
    glob = hpfl.GlobalComponents(
        public=gum.PublicWeights(*[rng.normal(size=s).astype(np.float32) for s in ((K, H), (K, H), (K, K))]),
        user_centres=rng.normal(size=(4, K)).astype(np.float32),
        user_mask=np.array([1, 1, 1, 0], np.float32),
        item_centres=rng.normal(size=(4, K)).astype(np.float32),
        item_mask=np.array([1, 0, 0, 0], np.float32),
    )
    acc_k = np.array([0.9, 0.2, 0.0, 0.6], np.float32)
    report = hpfl.ClientReport(
        public=state.model.public,
        attribute_accuracy=acc_k,
        attribute_iterations=np.ones(K, np.float32),
        accuracy=np.float32(0.75),
        train_loss_sum=np.float32(0),
        num_train_examples=np.float32(0),
        validation_loss_sum=np.float32(0),
        validation_correct=np.float32(0),
        num_validation_examples=np.float32(0),
    )
    new = process.parts['post_aggregation'].client_update(glob, state, report)
    for l, g, r in zip(state.model.public, glob.public, new.model.public):  # noqa: E741  (l: local, as in the paper's formula)
        tolerances.assert_reordered_close(r, acc_k[:, None] * l + (1 - acc_k[:, None]) * g, depth=3)  # Element-wise.
    theta = state.model.private.theta
    expected = theta.copy()
    expected[:9] = 0.75 * theta[:9] + 0.25 * np_global_embedding(
        theta[:9], glob.user_centres, glob.user_mask, 'distance'
    )
    tolerances.assert_reordered_close(new.model.private.theta, expected, depth=EMBEDDING_DEPTH)  # Padding as was.
    b = state.model.private.difficulty
    tolerances.assert_reordered_close(
        new.model.private.difficulty[:11], 0.75 * b[:11] + 0.25 * glob.item_centres[0], depth=EMBEDDING_DEPTH
    )  # A single centre: Emb^g is that centre (up to its weighting's roundings).
    np.testing.assert_array_equal(new.model.private.slip, state.model.private.slip)


# --------------------------------------------------------------------------------------------------- k-means
def test_kmeans_matches_numpy_lloyd():
    rng = np.random.default_rng(4)
    points = np.concatenate([rng.normal(c, 0.3, (6, 3)) for c in (-2, 0, 3)]).astype(np.float32)
    mask = np.ones(len(points), bool)
    mask[[2, 9]] = False
    points[2] = 50.0  # A masked outlier must influence nothing.
    centres, centre_mask = hpfl.maximin_init(points, mask, 3, 5)
    np_centres, np_mask = np_maximin(points, mask, 3, 5)
    np.testing.assert_array_equal(centres, np_centres)  # The chosen points themselves.
    np.testing.assert_array_equal(centre_mask, np_mask)
    # A centre is its members' mean (the memberships are decisions, not sums): at most all 18 points and a division.
    depth = len(points) + 1
    stepped, _ = hpfl.lloyd_step(points, mask, centres, centre_mask)
    tolerances.assert_reordered_close(stepped, np_lloyd(points, mask, np_centres, np_mask), depth=depth)
    result, result_mask, assignment = hpfl.kmeans(points, mask, 3, 5, iterations=4)
    expected, _ = np_kmeans(points, mask, 3, 5, 4)
    tolerances.assert_reordered_close(result, expected, depth=depth)  # The last iteration's means, as above.
    np.testing.assert_array_equal(result_mask, [1, 1, 1, 0, 0])
    assert len(set(np.asarray(assignment)[mask][:5])) == 1  # The first blob is one cluster.
    # Fewer valid points than clusters: one cluster per point; no valid point: no cluster.
    _, few = hpfl.maximin_init(points, np.arange(len(points)) < 2, 4, 5)
    np.testing.assert_array_equal(few, [1, 1, 0, 0, 0])
    _, none = hpfl.maximin_init(points, np.zeros(len(points), bool), 4, 5)
    np.testing.assert_array_equal(none, 0)


def test_client_centres_cluster_real_rows_only(process):
    state = hpfl.initial_client_state(CONFIG, 9, 11, private_seed=5)
    theta = np.array(state.model.private.theta)
    theta[9:] = 100.0  # Padding rows (this silo has 9 of the model's 12 user rows) must not move any centre.
    state = state._replace(model=state.model._replace(private=state.model.private._replace(theta=theta)))
    centres = process.parts['client_centres'](state)
    mask = np.arange(CONFIG.max_users) < 9
    expected, expected_mask = np_kmeans(
        theta, mask, 9 // 5 + 1, SMALL['max_local_clusters'], SMALL['kmeans_iterations']
    )
    # A centre: the mean of at most the 9 real rows (the memberships are decisions, not sums).
    tolerances.assert_reordered_close(centres.user_centres, expected, depth=9 + 1)
    np.testing.assert_array_equal(centres.user_mask, expected_mask)
    assert centres.user_mask.sum() == 2 and centres.item_mask.sum() == 11 // 5 + 1
    assert np.abs(centres.user_centres).max() < 10
    assert centres.user_centres.shape == (SMALL['max_local_clusters'], K)  # Only centres, never table rows.


def test_server_clusters_all_uploaded_centres_and_clients_update():
    process = hpfl.build_hpfl(CONFIG, global_cluster_divisor=3, accuracy_threshold=0.0, **SMALL)
    data = hpfl.federated_data(DATA, CONFIG, batch_size=16)
    states = hpfl.initial_client_states(DATA, CONFIG)
    trained, reports, centres = [], [], []
    for d, s in zip(data, states):
        uploaded, r, t = process.parts['client_update']((), d, s)  # Nothing received: HPFL trains its own model.
        trained.append(t)
        reports.append(r)
        centres.append(process.parts['client_centres'](t))
        tf.nest.map_structure(np.testing.assert_array_equal, uploaded, centres[-1])  # Its upload: the centres.
    out = process.parts['round_from_uploads'](process.initialize(), centres, reports, trained)
    points = np.concatenate([c.user_centres for c in centres])
    valid = np.concatenate([c.user_mask for c in centres]) > 0
    n = int(valid.sum())
    expected, expected_mask = np_kmeans(
        points, valid, n // 3 + 1, SMALL['max_global_clusters'], SMALL['kmeans_iterations']
    )
    glob = hpfl.global_components(out.state)
    tolerances.assert_reordered_close(glob.user_centres, expected, depth=n + 1)  # The mean of at most the n centres.
    np.testing.assert_array_equal(glob.user_mask, expected_mask)
    assert out.metrics['clustering']['uploaded_user_centres'] == n == 2 + 3 + 3
    assert out.metrics['clustering']['dropped_centre_uploads'] == 0
    for silo, t, r, new in zip(DATA.silos, trained, reports, out.private_states):
        theta = t.model.private.theta[: silo.num_users]
        blended = r.accuracy * theta + (1 - r.accuracy) * np_global_embedding(
            theta, expected, expected_mask, 'distance'
        )
        # The centres' means (n + 1, as above) feed the weighted embedding.
        tolerances.assert_reordered_close(
            new.model.private.theta[: silo.num_users], blended, depth=n + 1 + EMBEDDING_DEPTH
        )


# ----------------------------------------------------------------------------------------- training, ablations
def _validation_mse(states):
    predictions = hpfl.predict_silos(CONFIG, states, DATA, split='validation')
    return float(np.mean(np.concatenate([(p.prediction - p.label) ** 2 for p in predictions])))


def test_hpfl_training_decreases_validation_loss():
    process = hpfl.build_hpfl(
        CONFIG,
        client_epochs=2,
        accuracy_threshold=0.5,
        client_optimizer=tff.learning.optimizers.build_adam(0.05),
        **SMALL,
    )
    data = hpfl.federated_data(DATA, CONFIG, batch_size=16)
    state, states = process.initialize(), hpfl.initial_client_states(DATA, CONFIG)
    before = _validation_mse(states)
    losses = []
    for _ in range(6):
        out = process.next(state, data, states)
        state, states = out.state, out.private_states
        losses.append(out.metrics['client_work']['validation_loss'])
    after = _validation_mse(states)
    assert after < before - 0.02, (before, after, losses)
    assert losses[-1] < losses[0]
    assert out.metrics['attributes_aggregated'] >= 1


def _train_locally(optimizer, row_updates, epochs=2, use_discrimination=True, silo=0):
    config = dataclasses.replace(CONFIG, use_discrimination=use_discrimination)
    data = hpfl.client_data(DATA.silos[silo], config, batch_size=16, shuffle=False)
    weights = hpfl.initial_client_states(DATA, config)[silo].model
    weights = tf.nest.map_structure(tf.constant, weights)
    trained = tf.function(
        lambda: hpfl.local_training(
            weights, data.train, data.item_attributes, optimizer, config, epochs=epochs, row_updates=row_updates
        )
    )()
    return weights, trained


@pytest.mark.parametrize('use_discrimination', [True, False])
def test_lazy_row_updates_equal_dense_updates_for_sgd(use_discrimination):
    """SGD leaves a zero-gradient row unchanged, so stepping only the batch's rows is the dense step exactly."""
    sgd = tff.learning.optimizers.build_sgdm(learning_rate=0.5)
    _, (dense, n_dense, loss_dense, it_dense) = _train_locally(sgd, 'dense', use_discrimination=use_discrimination)
    start, (lazy, n_lazy, loss_lazy, it_lazy) = _train_locally(sgd, 'lazy', use_discrimination=use_discrimination)
    for a, b in zip(tf.nest.flatten(dense), tf.nest.flatten(lazy)):
        np.testing.assert_array_equal(a, b)
    assert int(n_dense) == int(n_lazy) and float(loss_dense) == float(loss_lazy)
    np.testing.assert_array_equal(it_dense, it_lazy)
    assert not np.allclose(start.private.theta, lazy.private.theta)  # It did train.


def test_lazy_adam_steps_only_the_rows_a_batch_touches():
    adam = tff.learning.optimizers.build_adam(learning_rate=0.05)
    # One step from fresh moments: rows without gradient do not move in dense Adam either, so both agree.
    silo = DATA.silos[0]  # 10 of the 14 padded item rows and 8 of the 12 user rows are real.
    config = CONFIG
    train = hpfl.split_dataset(silo, config, 'train', batch_size=10_000)
    attributes = tf.constant(hpfl.client_data(silo, config).item_attributes)
    weights = tf.nest.map_structure(tf.constant, hpfl.initial_client_states(DATA, config)[0].model)
    one = {
        mode: tf.function(
            lambda mode=mode: hpfl.local_training(weights, train.take(1), attributes, adam, config, row_updates=mode)
        )()[0]
        for mode in hpfl.ROW_UPDATES
    }
    for a, b in zip(tf.nest.flatten(one['dense']), tf.nest.flatten(one['lazy'])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Several small batches: lazy Adam never moves a row no batch touched (padded rows, unrated items) and does
    # move the rows that were touched; dense Adam moves touched rows on stale momentum after their last batch, so
    # the two differ.
    start, (lazy, *_) = _train_locally(adam, 'lazy')
    _, (dense, *_) = _train_locally(adam, 'dense')
    touched_items = np.unique(silo.item[silo.split == um.SPLIT_TRAIN])
    untouched_items = np.setdiff1d(np.arange(config.max_items), touched_items)
    assert untouched_items.size > 0
    np.testing.assert_array_equal(
        np.asarray(lazy.private.difficulty)[untouched_items], np.asarray(start.private.difficulty)[untouched_items]
    )
    np.testing.assert_array_equal(
        np.asarray(lazy.private.theta)[silo.num_users :], np.asarray(start.private.theta)[silo.num_users :]
    )
    moved = np.abs(np.asarray(lazy.private.difficulty) - np.asarray(start.private.difficulty)).max(axis=1)
    assert np.all(moved[touched_items] > 0)
    assert not np.allclose(lazy.private.theta, dense.private.theta)


def test_row_updates_must_be_known():
    with pytest.raises(ValueError, match='row_updates'):
        hpfl.build_hpfl(CONFIG, row_updates='sparse', **SMALL)


def _intrinsics(computation) -> str:
    return computation.to_building_block().compact_representation()


def test_ablations_switch_off_the_other_part():
    data = hpfl.federated_data(DATA, CONFIG, batch_size=16)
    initial = hpfl.initial_client_states(DATA, CONFIG)
    results = {}
    for name, public, private in (('distributed', False, False), ('hpfl_k', True, False), ('hpfl_r', False, True)):
        process = hpfl.build_hpfl(
            CONFIG, aggregate_public=public, aggregate_private=private, accuracy_threshold=0.0, **SMALL
        )
        state = process.initialize()
        results[name] = (process, state, process.next(state, data, initial))
    local = results['distributed'][2].private_states
    k_process, k_initial, k_out = results['hpfl_k']
    r_process, r_initial, r_out = results['hpfl_r']
    for d, k, r in zip(local, k_out.private_states, r_out.private_states):
        # The same local training on the same inputs: exactly.
        for a, b in zip(d.model.private, k.model.private):  # HPFL-K: private tables as trained locally.
            np.testing.assert_array_equal(a, b)
        for a, b in zip(d.model.public, r.model.public):  # HPFL-R: public components as trained locally.
            np.testing.assert_array_equal(a, b)
        assert not np.allclose(d.model.public.skill_W, k.model.public.skill_W)
        assert not np.allclose(d.model.private.theta, r.model.private.theta)
    np.testing.assert_array_equal(hpfl.global_components(k_out.state).user_mask, 0)  # No clustering happened.
    for a, b in zip(hpfl.global_components(r_out.state).public, hpfl.global_components(r_initial).public):
        np.testing.assert_array_equal(a, b)  # No public aggregation happened.
    assert hpfl.global_components(r_out.state).user_mask.sum() > 0
    assert 'federated_aggregate' not in _intrinsics(k_process.next)  # HPFL-K uploads no centres at all.
    assert 'federated_aggregate' in _intrinsics(r_process.next)
    assert _intrinsics(r_process.next).count('federated_sum') < _intrinsics(k_process.next).count('federated_sum')


# ---------------------------------------------------------------------------------------------------- privacy
def test_raw_private_tables_reach_the_server_only_through_the_centres(process):
    """Audit design (`fedpersonal.privacy.audit` flags values derived *only* from the designated private input).

    1. `round_from_uploads(state, centres, reports, trained_states)` takes the centres as an explicit argument (the
       declassified upload). Audited with the *trained* client states as the private input, it has no violation:
       the trained tables reach no SERVER intrinsic and no SERVER result except through that argument.
    2. A variant that uploads raw table rows in place of the centres, or next to them, fails the same audit.
    3. Strictly, centres are derived from private values: feeding `client_centres(trained)` into the same round is
       flagged, at the `federated_aggregate` that collects the centres and nowhere else (plus the clustering
       counts in the metrics, which are computed from the centres). The same holds for the whole `next` with the
       clients' input states private: the only violation is the centre upload (the centre masks, n // 5 + 1
       clusters, depend only on the private table sizes: the upload reveals each silo's size roughly); HPFL-K,
       which uploads no centres, has none.
    """
    round_from_uploads, client_centres = process.parts['round_from_uploads'], process.parts['client_centres']
    params = round_from_uploads.type_signature.parameter
    assert audit.audit_private_dataflow(round_from_uploads, private_parameter_index=3) == []

    def only_shapes(type_spec, out):
        if isinstance(type_spec, tff.StructType):
            for _, member in tff.structure.iter_elements(type_spec):
                only_shapes(member, out)
        elif isinstance(type_spec, tff.TensorType):
            out.add(tuple(type_spec.shape))
        return out

    centre_shapes = only_shapes(params[1].member, set())
    assert centre_shapes == {(SMALL['max_local_clusters'], K), (SMALL['max_local_clusters'],)}

    @tff.tensorflow.computation(process.private_state_type)
    def raw_rows(state):
        rows = SMALL['max_local_clusters']
        return hpfl.Centres(
            state.model.private.theta[:rows], tf.ones([rows]), state.model.private.difficulty[:rows], tf.ones([rows])
        )

    @tff.federated_computation(params[0], params[1], params[2], params[3])
    def rows_instead_of_centres(state, centres, reports, trained):
        del centres
        return round_from_uploads(state, tff.federated_map(raw_rows, trained), reports, trained)

    @tff.tensorflow.computation(process.private_state_type)
    def table(state):
        return state.model.private.theta

    @tff.federated_computation(params[0], params[1], params[2], params[3])
    def rows_next_to_centres(state, centres, reports, trained):
        out = round_from_uploads(state, centres, reports, trained)
        return out.state, tff.federated_sum(tff.federated_map(table, trained)), out.private_states

    for leaky in (rows_instead_of_centres, rows_next_to_centres):
        violations = audit.audit_private_dataflow(leaky, private_parameter_index=3)
        assert any(v.where.startswith('federated_') for v in violations), leaky

    @tff.federated_computation(params[0], params[2], params[3])
    def centres_from_trained(state, reports, trained):
        return round_from_uploads(state, tff.federated_map(client_centres, trained), reports, trained)

    strict = audit.audit_private_dataflow(centres_from_trained, private_parameter_index=2)
    assert {v.where for v in strict} <= {'federated_aggregate', 'result metrics'} and strict

    assert {v.where for v in audit.audit_private_dataflow(process.next, private_parameter_index=2)} == {
        'federated_aggregate'
    }
    hpfl_k = hpfl.build_hpfl(CONFIG, aggregate_private=False, **SMALL)
    assert audit.audit_private_dataflow(hpfl_k.next, private_parameter_index=2) == []

    # A leak of the raw input tables from `next` itself is caught at its own aggregation.
    next_params = process.next.type_signature.parameter

    @tff.federated_computation(next_params[0], next_params[1], next_params[2])
    def next_leaking_input_rows(state, data, private):
        out = process.next(state, data, private)
        return out.state, tff.federated_sum(tff.federated_map(table, private)), out.private_states

    violations = audit.audit_private_dataflow(next_leaking_input_rows, private_parameter_index=2)
    assert 'federated_sum' in {v.where for v in violations}


def test_private_state_is_client_placed_input_and_output(process):
    signature = process.next.type_signature
    assert signature.parameter[2].placement is tff.CLIENTS
    assert signature.result.private_states.placement is tff.CLIENTS
    assert signature.result.state.placement is tff.SERVER


# ------------------------------------------------------------------------------------------------ data errors
@pytest.mark.parametrize(
    'change, field',
    [
        (lambda s: dataclasses.replace(s, label=s.label + 2), 'label'),
        (lambda s: dataclasses.replace(s, item=s.item + 100), 'item'),
        (lambda s: dataclasses.replace(s, item_attributes=s.item_attributes[:, :2]), 'item_attributes'),
        (lambda s: dataclasses.replace(s, num_users=99), 'num_users'),
    ],
)
def test_bad_client_data_names_the_client_and_the_field(change, field):
    silo = change(DATA.silos[1])
    with pytest.raises(hpfl.HpflDataError, match=f"client 'silo_1': {field}"):
        hpfl.client_data(silo, CONFIG, data_name='tiny')


def test_predictions_are_per_silo_on_the_label_scale():
    states = hpfl.initial_client_states(DATA, CONFIG)
    predictions = hpfl.predict_silos(CONFIG, states, DATA, split='test')
    assert [p.client_id for p in predictions] == [s.client_id for s in DATA.silos]
    for silo, state, p in zip(DATA.silos, states, predictions):
        keep = silo.split == um.SPLIT_TEST
        assert p.prediction.shape == p.label.shape == (keep.sum(),)
        q = silo.item_attributes[silo.item[keep]]
        expected = gum.predict(
            state.model, tf.constant(silo.user[keep]), tf.constant(silo.item[keep]), tf.constant(q)
        ).numpy()
        # Another batching (oneDNN may pick another kernel for another shape): the prediction's sums reordered.
        tolerances.assert_reordered_close(p.prediction, expected, depth=GUM_DEPTH)
    with pytest.raises(ValueError, match='2 client states for 3 silos'):
        hpfl.predict_silos(CONFIG, states[:2], DATA)
