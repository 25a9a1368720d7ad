"""The pure parts of benchmarks/pfllib_crosscheck.py (no PFLlib, no PyTorch): the Keras <-> PyTorch weight layouts,
a client's whole model from its global and local layers, the rows and their verdicts."""

import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), 'benchmarks'))
import pfllib_crosscheck_lib as crosscheck


def _keras_cnn(seed=0):
    """fedavg_cnn's weight shapes (Keras layout), random values."""
    rng = np.random.default_rng(seed)
    shapes = [(5, 5, 1, 32), (32,), (5, 5, 32, 64), (64,), (1024, 512), (512,), (512, 10), (10,)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _forward_keras(w, x_nhwc):
    """A numpy forward pass in Keras' layout (valid conv, ReLU, 2x2 max-pool, flatten row/column/channel, dense)."""

    def conv(x, k, b):
        kh, kw = k.shape[:2]
        n, h, wd, _ = x.shape
        out = np.zeros((n, h - kh + 1, wd - kw + 1, k.shape[3]), np.float64)
        for i in range(kh):
            for j in range(kw):
                out += np.einsum('nhwc,co->nhwo', x[:, i : i + h - kh + 1, j : j + wd - kw + 1], k[i, j])
        return np.maximum(out + b, 0)

    def pool(x):
        n, h, wd, c = x.shape
        return x.reshape(n, h // 2, 2, wd // 2, 2, c).max(axis=(2, 4))

    x = pool(conv(x_nhwc, w[0], w[1]))
    x = pool(conv(x, w[2], w[3]))
    x = np.maximum(x.reshape(len(x), -1) @ w[4] + w[5], 0)
    return x @ w[6] + w[7]


def _forward_torch(w, x_nchw):
    """The same network in PyTorch's layout (weights [out, in, h, w], flatten channel/row/column, x @ W.T)."""

    def conv(x, k, b):
        kh, kw = k.shape[2:]
        n, _, h, wd = x.shape
        out = np.zeros((n, k.shape[0], h - kh + 1, wd - kw + 1), np.float64)
        for i in range(kh):
            for j in range(kw):
                out += np.einsum('nchw,oc->nohw', x[:, :, i : i + h - kh + 1, j : j + wd - kw + 1], k[:, :, i, j])
        return np.maximum(out + b[None, :, None, None], 0)

    def pool(x):
        n, c, h, wd = x.shape
        return x.reshape(n, c, h // 2, 2, wd // 2, 2).max(axis=(3, 5))

    x = pool(conv(x_nchw, w[0], w[1]))
    x = pool(conv(x, w[2], w[3]))
    x = np.maximum(x.reshape(len(x), -1) @ w[4].T + w[5], 0)
    return x @ w[6].T + w[7]


def test_layouts_round_trip_and_compute_the_same_function():
    keras = _keras_cnn()
    torch_layout = crosscheck.keras_to_torch(keras)
    assert [w.shape for w in torch_layout] == [
        (32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (512, 1024), (512,), (10, 512), (10,)
    ]  # fmt: skip
    back = crosscheck.torch_to_keras(torch_layout)
    assert crosscheck.max_abs_diff(keras, back) == 0.0
    x = np.random.default_rng(1).standard_normal((2, 28, 28, 1))
    np.testing.assert_allclose(
        _forward_keras(keras, x), _forward_torch(torch_layout, x.transpose(0, 3, 1, 2)), rtol=1e-9, atol=1e-6
    )


def test_layout_without_the_flatten_permutation_computes_another_function():
    """The check above can fail: a plain transpose of fc1 (no flatten reordering) is another network."""
    keras = _keras_cnn()
    plain = crosscheck.keras_to_torch(keras, flatten_chw=None)
    x = np.random.default_rng(1).standard_normal((2, 28, 28, 1))
    assert np.abs(_forward_keras(keras, x) - _forward_torch(plain, x.transpose(0, 3, 1, 2))).max() > 1e-3


def test_partial_models_convert_alone():
    """A server holding only some layers (FedPer's base, LG-FedAvg's head) converts layer by layer."""
    keras = _keras_cnn()
    full = crosscheck.keras_to_torch(keras)
    assert crosscheck.max_abs_diff(crosscheck.keras_to_torch(keras[:6]), full[:6]) == 0.0
    assert crosscheck.max_abs_diff(crosscheck.torch_to_keras(full[6:]), keras[6:]) == 0.0


def test_full_weights_places_local_layers():
    g = [np.full(1, i) for i in range(6)]
    local = [np.full(1, 10 + i) for i in range(2)]
    merged = crosscheck.full_weights(g, local, ('fc',))
    assert [int(w[0]) for w in merged] == [0, 1, 2, 3, 4, 5, 10, 11]
    merged = crosscheck.full_weights([np.full(1, 7), np.full(1, 8)], g, ('conv1', 'conv2', 'fc1'))
    assert [int(w[0]) for w in merged] == [0, 1, 2, 3, 4, 5, 7, 8]
    with pytest.raises(ValueError, match='left over'):
        crosscheck.full_weights(g + local, local, ('fc',))
    # A method's own local layer (FedDBE's representation bias) follows the whole CNN.
    merged = crosscheck.full_weights(g + local, [np.full(1, 9)], ('representation_bias',))
    assert [int(w[0]) for w in merged] == [0, 1, 2, 3, 4, 5, 10, 11, 9]
    with pytest.raises(ValueError, match='left over'):
        crosscheck.full_weights(g, local + [np.full(1, 9)], ('fc',))


def test_weight_diffs_compare_global_layers_or_the_clients_alone():
    keras = _keras_cnn()
    moved = [w + 0.5 for w in keras]
    clients, their_clients = [keras, keras], [keras, [w + 0.25 for w in keras]]
    # A server holding the whole model beside fedpersonal's base (FedPer): the base's layers compared.
    diffs = crosscheck.weight_diffs(keras[:6], ('conv1', 'conv2', 'fc1'), keras[:6] + moved[6:], clients, their_clients)
    assert diffs == pytest.approx({'global': 0.0, 'client0': 0.0, 'client1': 0.25}, abs=1e-6)
    assert crosscheck.weight_diffs(keras, crosscheck.LAYERS, moved, clients, clients)['global'] == pytest.approx(0.5)
    # FedAMP: no global model on fedpersonal's side (PFLlib's server keeps its initial one): the clients alone.
    diffs = crosscheck.weight_diffs([], [], moved, clients, their_clients)
    assert diffs == pytest.approx({'client0': 0.0, 'client1': 0.25}, abs=1e-6)
    with pytest.raises(ValueError, match='no global layer'):
        crosscheck.weight_diffs(keras, [], moved, clients, clients)
    with pytest.raises(ValueError, match='2 clients beside 1'):
        crosscheck.weight_diffs([], [], [], clients, clients[:1])


def test_rows_and_verdicts():
    row = crosscheck.make_row('fedavg', 'pathological', 2, 3e-8, 0.5, 0.5, 'abc')
    assert tuple(row) == crosscheck.ROW_KEYS
    assert row['verdict'] == 'equal' and row['mode'] == 'exact'
    row = crosscheck.make_row('apfl', 'pathological', 2, 0.017, 0.51, 0.57, 'abc', explanation='clientapfl.py')
    assert row['verdict'] == 'explained' and row['explanation'] == 'clientapfl.py'
    assert tuple(row)[:-1] == crosscheck.ROW_KEYS
    assert crosscheck.make_row('x', 'p', 2, 0.5, 0, 0, 'c')['verdict'] == 'unexplained'
    assert crosscheck.verdict(math.nan, 'reason') == ('explained', 'reason')
    assert crosscheck.verdict(math.nan, None) == ('unexplained', None)
    assert crosscheck.verdict(1e-3, 'unused') == ('equal', None)


def test_merge_rows_replaces_same_key():
    a = crosscheck.make_row('fedavg', 'pathological', 2, 0.0, 0.5, 0.5, 'c')
    b = crosscheck.make_row('fedavg', 'dirichlet', 2, 0.0, 0.5, 0.5, 'c')
    newer = dict(a, accuracy_pfllib=0.6)
    merged = crosscheck.merge_rows([a, b], [newer])
    assert merged == [b, newer]


def test_exact_train_rows():
    assert crosscheck.exact_train_rows(137, 100, 10) == 100
    assert crosscheck.exact_train_rows(57, 100, 10) == 40
    assert crosscheck.exact_train_rows(19, 100, 10) == 0


def test_max_abs_diff_checks_shapes():
    with pytest.raises(ValueError):
        crosscheck.max_abs_diff([np.zeros(2)], [np.zeros(3)])
    with pytest.raises(ValueError):
        crosscheck.max_abs_diff([np.zeros(2)], [])


def test_parse_overrides_types_by_field():
    class Config:
        fedprox_mu = 0.01
        pfedme_k = 5

    assert crosscheck.parse_overrides(['fedprox_mu=1', 'pfedme_k=3'], Config()) == {'fedprox_mu': 1.0, 'pfedme_k': 3}
    with pytest.raises(ValueError, match='name=value'):
        crosscheck.parse_overrides(['unknown=1'], Config())
    with pytest.raises(ValueError, match='name=value'):
        crosscheck.parse_overrides(['fedprox_mu'], Config())


def test_statistical_verdict_one_seed_rule():
    """One seed per side: equal within 1 point, not beyond (the rule can fail)."""
    assert crosscheck.statistical_verdict([0.80], [0.809], None)[:2] == ('equal', None)
    kind, reason, bound, rule = crosscheck.statistical_verdict([0.80], [0.82], None)
    assert (kind, reason, bound) == ('unexplained', None, 0.01) and rule.startswith('one-seed')
    assert crosscheck.statistical_verdict([0.80], [0.82], 'why')[:2] == ('explained', 'why')
    assert crosscheck.statistical_verdict([math.nan], [0.8], None)[0] == 'unexplained'
    with pytest.raises(ValueError):
        crosscheck.statistical_verdict([], [0.8], None)


def test_statistical_verdict_seed_spread():
    """Two or more seeds on both sides: the means within the larger range over seeds."""
    kind, _, bound, rule = crosscheck.statistical_verdict([0.70, 0.80], [0.78, 0.79], None)
    assert kind == 'equal' and rule == 'seed spread' and bound == pytest.approx(0.10)
    # Tight seeds: a 2-point gap of the means is beyond a 0.2-point spread (and beyond the one-seed rule too).
    assert crosscheck.statistical_verdict([0.800, 0.802], [0.821, 0.822], None)[0] == 'unexplained'
    # Tight seeds, a 0.5-point gap: the one-seed rule would call it equal, the spread does not.
    assert crosscheck.statistical_verdict([0.800, 0.801], [0.805, 0.806], None)[0] == 'unexplained'
    # Seeds on one side only: the one-seed rule.
    assert crosscheck.statistical_verdict([0.70, 0.80], [0.745], None)[2:] == (0.01, 'one-seed rule (1 point)')


def test_statistical_row():
    ours = {0: [0.5, 0.6, 0.7], 1: [0.5, 0.62, 0.72]}
    theirs = {0: [0.55, 0.66, 0.705], 1: [0.55, 0.64, 0.715]}
    row = crosscheck.make_statistical_row('fedavg', 'pathological', 3, ours, theirs, {'a': 1}, {'b': 2}, 'abc')
    assert tuple(row)[: len(crosscheck.ROW_KEYS)] == crosscheck.ROW_KEYS
    assert row['mode'] == 'statistical' and row['max_abs_weight_diff'] is None
    assert row['accuracy_fedpersonal'] == pytest.approx(0.71) and row['accuracy_pfllib'] == pytest.approx(0.71)
    assert row['curve_fedpersonal'] == pytest.approx([0.5, 0.61, 0.71])
    assert row['max_curve_gap'] == pytest.approx(0.05)
    assert row['verdict'] == 'equal' and row['seeds_pfllib'] == [0, 1]
    assert row['curves_by_seed_pfllib']['1'] == [0.55, 0.64, 0.715]
    assert 'explanation' not in row
    far = {0: [0.5, 0.6, 0.6]}
    row = crosscheck.make_statistical_row('apfl', 'p', 3, {0: ours[0]}, far, {}, {}, 'c', explanation='clientapfl')
    assert row['verdict'] == 'explained' and row['explanation'] == 'clientapfl'
    assert row['verdict_rule'].startswith('one-seed')
    with pytest.raises(ValueError, match='3 rounds'):
        crosscheck.make_statistical_row('x', 'p', 3, {0: [0.5]}, far, {}, {}, 'c')
    # Statistical rows sit beside exact rows of the same method and partition.
    exact = crosscheck.make_row('fedavg', 'pathological', 2, 0.0, 0.5, 0.5, 'c')
    assert len(crosscheck.merge_rows([exact], [dict(row, method='fedavg', partition='pathological')])) == 2


def test_config_fields_records_what_a_method_reads():
    class Config:
        pfedme_lambda, pfedme_k, pfedme_personal_learning_rate, fedprox_mu = 15.0, 5, 0.01, 0.01
        fedamp_alpha, fedamp_sigma, fedamp_lamda, fedamp_variant = 1.0, 2.0, 3.0, 'pfllib'

    fields = crosscheck.config_fields(crosscheck.METHODS['pfedme'].args, Config())
    assert fields == {'pfedme_lambda': 15.0, 'pfedme_k': 5, 'pfedme_personal_learning_rate': 0.01}
    assert crosscheck.config_fields(crosscheck.METHODS['fedavg'].args, Config()) == {}
    # FedAMP's PFLlib arguments (alphaK, sigma, lamda); its variant is no argument of PFLlib's.
    assert crosscheck.METHODS['fedamp'].args(Config()) == {'alphaK': 1.0, 'sigma': 2.0, 'lamda': 3.0}
    fields = crosscheck.config_fields(crosscheck.METHODS['fedamp'].args, Config())
    assert fields == {'fedamp_alpha': 1.0, 'fedamp_sigma': 2.0, 'fedamp_lamda': 3.0}


def test_method_options_records_every_option_of_the_rows_module():
    class Config:
        apfl_alpha, apfl_variant, fedprox_mu = 0.5, 'pfllib', 0.01

    # The variant, which PFLlib's arguments do not read, is recorded too.
    assert crosscheck.method_options('apfl', Config()) == {'apfl_alpha': 0.5, 'apfl_variant': 'pfllib'}
    assert crosscheck.method_options('fedavg', Config()) == {}  # fed_avg declares no options.
    with pytest.raises(ValueError, match="no algorithm module declares a row 'no_such_row'"):
        crosscheck.method_options('no_such_row', Config())
