"""User-level DP of the global parameters: the aggregator sees only them, clips, adds noise; the epsilon."""

import dataclasses
import math

import dp_accounting
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal.algorithms import furl
from fedpersonal.privacy import dp
from fedpersonal.program import config_parts
from tests import tolerances
from tests.algorithms import fed_recon_test as recon
from tests.algorithms import furl_test

UNIFORM = tff.learning.ClientWeighting.UNIFORM
SGD = tff.learning.optimizers.build_sgdm


class Recording(tff.aggregators.UnweightedAggregationFactory):
    """Delegates to `inner`, recording the value type every aggregation process is created for."""

    def __init__(self, inner):
        self.inner, self.value_types = inner, []

    def create(self, value_type):
        self.value_types.append(value_type)
        return self.inner.create(value_type)


def _shapes(value_type):
    return [tuple(t.shape) for t in tff.types.structure_from_tensor_type_tree(lambda t: t, value_type)]


def _clients(sizes, seed=1):
    users, items = recon.true_factors(len(sizes), seed=seed)
    return [recon.client_dataset(users[i], items, items=np.arange(n)) for i, n in enumerate(sizes)]


def _fed_recon_round(aggregator, data, weighting=UNIFORM, **kwargs):
    process = recon.build(model_aggregator=aggregator, client_weighting=weighting, simulation='per_client', **kwargs)
    return process.get_model_weights(process.run_round(process.initialize(), data).state).trainable[0]


# ------------------------------------------------------------------ (a) only global parameters reach the aggregator
def test_fed_recon_aggregates_only_the_global_parameters():
    recording = Recording(dp.build_dp_aggregator(noise_multiplier=1.0, clients_per_round=2, clip=1.0))
    recon.build(model_aggregator=recording, client_weighting=UNIFORM, simulation='per_client')
    (value_type,) = recording.value_types
    assert _shapes(value_type) == [(recon.NUM_ITEMS, recon.DIM)]  # The item matrix; not the (1, DIM) user embedding.


def test_furl_aggregates_only_the_federated_parameters():
    recording = Recording(dp.build_dp_aggregator(noise_multiplier=1.0, clients_per_round=2, clip=1.0))
    process = furl.build_furl(
        furl_test.furl_model_fn,
        loss_fn=tf.keras.losses.MeanSquaredError,
        model_aggregator=recording,
        client_weighting=UNIFORM,
        simulation='per_client',
    )
    (value_type,) = recording.value_types
    private_shapes = [tuple(t.shape) for t in process.private_state_type.trainable]
    assert _shapes(value_type) == [(furl_test.NUM_ITEMS, furl_test.DIM)]
    assert private_shapes and not set(private_shapes) & set(_shapes(value_type))


# ------------------------------------------------------------------------------- (b) clipping and uniform weights
def test_no_noise_and_a_large_clip_is_the_unweighted_mean():
    data = _clients([3, 12])  # Unequal sizes: the example-weighted mean differs.
    private = _fed_recon_round(dp.build_dp_aggregator(noise_multiplier=0.0, clients_per_round=2, clip=1e6), data)
    unweighted = _fed_recon_round(tff.aggregators.UnweightedMeanFactory(), data)
    weighted = _fed_recon_round(None, data, weighting=tff.learning.ClientWeighting.NUM_EXAMPLES)
    # The same client training (deterministic); only the mean of the 2 clients' updates differs in its order (the
    # clip's factor is exactly 1, the zero noise exactly 0): its sum, the division, the server step.
    bound = tolerances.reorder_bound(depth=2 + 2, scale=tolerances.magnitude(private))
    np.testing.assert_allclose(private, unweighted, rtol=0, atol=bound)
    assert np.abs(private - weighted).max() > 100 * bound  # The example-weighted mean is another mean.
    assert np.abs(private - recon.ITEM_INIT).max() > 1e-3 > 100 * bound  # The round trained.


@pytest.mark.parametrize('clip', [0.005, None])  # Fixed, and adaptive (its first round clips at the initial 0.005).
def test_a_small_clip_bounds_the_update_norm(clip):
    data = _clients([12])
    aggregator = dp.build_dp_aggregator(noise_multiplier=0.0, clients_per_round=1, clip=clip, initial_clip=0.005)
    unclipped = _fed_recon_round(None, data) - recon.ITEM_INIT
    clipped = _fed_recon_round(aggregator, data) - recon.ITEM_INIT
    assert np.linalg.norm(unclipped) > 0.02
    # The update is read back as weights minus ITEM_INIT: adding it to the weights rounded each entry at the weights'
    # scale (a rounding each for the server's step and the update's own scaling, u = 2**-24), which dominates the
    # clip's own rounding (its norm over the 12 x 7 entries, the division and the scaling).
    entry = 2 * tolerances.U32 * tolerances.magnitude(recon.ITEM_INIT)
    norm_bound = np.sqrt(clipped.size) * entry + tolerances.reorder_bound(depth=clipped.size + 2, scale=0.005)
    assert abs(np.linalg.norm(clipped) - 0.005) <= norm_bound
    direction = unclipped / np.linalg.norm(unclipped)
    # Scaled down, same direction: each entry off by the two read-backs' roundings over their norms and the norms'.
    direction_bound = entry / 0.005 + entry / np.linalg.norm(unclipped) + norm_bound / 0.005
    np.testing.assert_allclose(clipped / 0.005, direction, rtol=0, atol=direction_bound)


# ------------------------------------------------------------------------------------------------ (c) the noise
def test_noise_has_stddev_z_clip_over_clients_and_is_seeded():
    """No client training (learning rate 0): the global change is the noise alone, stddev z * C / m. With a fixed
    clip and a noise seed the noise is a function of the seed (and the round); TFF's own queries (and adaptive
    clipping) draw it with unseeded TF random ops: two runs differ even with TensorFlow's global seed set."""
    data = _clients([12, 12])
    z, clip, m = 2.0, 0.5, 2
    frozen = dict(client_optimizer=SGD(learning_rate=0.0))

    def noise(**kwargs):
        tf.random.set_seed(0)
        aggregator = dp.build_dp_aggregator(noise_multiplier=z, clients_per_round=m, clip=clip, **kwargs)
        return _fed_recon_round(aggregator, data, **frozen) - recon.ITEM_INIT

    seeded = [noise(noise_seed=1), noise(noise_seed=1), noise(noise_seed=2)]
    unseeded = [noise(), noise()]
    # 84 independent draws of N(0, sigma^2): n * std^2 / sigma^2 (about the sample mean) is chi-squared with n - 1
    # degrees of freedom. Its two-sided 1e-6 quantiles bound the ratio: a correct noise fails one of the 5 checks
    # with probability below 5e-6; a wrong scale (z * C, not divided by m: ratio 2; no noise: 0) fails far outside.
    n = seeded[0].size
    low, high = np.sqrt(scipy.stats.chi2.ppf([0.5e-6, 1 - 0.5e-6], df=n - 1) / n)
    assert low > 0.5 and high < 1.6, (low, high)
    for drawn in seeded + unseeded:
        assert low < np.std(drawn) / (z * clip / m) < high
    np.testing.assert_array_equal(seeded[0], seeded[1])
    assert not np.allclose(seeded[0], seeded[2])
    assert not np.allclose(unseeded[0], unseeded[1])


def test_seeded_noise_differs_between_rounds():
    data = _clients([12, 12])
    aggregator = dp.build_dp_aggregator(noise_multiplier=2.0, clients_per_round=2, clip=0.5, noise_seed=3)
    process = recon.build(
        model_aggregator=aggregator,
        client_weighting=UNIFORM,
        simulation='per_client',
        client_optimizer=SGD(learning_rate=0.0),
    )
    state = process.initialize()
    weights = [process.get_model_weights(state).trainable[0]]
    for _ in range(2):
        state = process.run_round(state, data).state
        weights.append(process.get_model_weights(state).trainable[0])
    first, second = weights[1] - weights[0], weights[2] - weights[1]
    # Independent rounds' noise: the sample correlation of n = 84 pairs has standard error about 1 / sqrt(n); 5 of
    # them (0.55) bound it (a reused noise would correlate fully).
    assert not np.allclose(first, second) and abs(np.corrcoef(first.ravel(), second.ravel())[0, 1]) < 5 / np.sqrt(
        first.size
    )


# ------------------------------------------------------------------------------------------------ (d) the epsilon
def _direct(z, n, m, rounds, delta):
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.GaussianDpEvent(z / 2)  # Replace-one: sensitivity 2C.
    if m < n:
        event = dp_accounting.SampledWithoutReplacementDpEvent(n, m, event)
    for _ in range(rounds):
        accountant.compose(event)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize('z, n, m, rounds', [(1.0, 1000, 10, 3), (0.8, 754, 100, 2), (3.0, 10, 10, 30)])
def test_epsilon_equals_dp_accounting_round_by_round(z, n, m, rounds):
    ours = dp.epsilon(noise_multiplier=z, num_clients=n, clients_per_round=m, rounds=rounds, target_delta=1e-5)
    # float64, the rounds' RDP composed in another order (at most 30 terms: relative error ~1e-14).
    assert ours == pytest.approx(_direct(z, n, m, rounds, 1e-5), rel=1e-9)


def test_a_runs_epsilon_per_round_equals_the_epsilon_function():
    privacy = dp.DifferentialPrivacy(noise_multiplier=1.1, clients_per_round=20, num_clients=700, target_delta=1e-6)
    for rounds in (0, 1, 7, 300):
        expected = dp.epsilon(
            noise_multiplier=1.1, num_clients=700, clients_per_round=20, rounds=rounds, target_delta=1e-6
        )
        # rounds * (one round's RDP) against the accountant's sum of `rounds` terms: float64 (300 terms: ~3e-14).
        assert privacy.epsilon(rounds) == pytest.approx(expected, rel=1e-12)


def test_epsilon_of_every_client_every_round_is_the_gaussian_mechanism():
    """RDP of the Gaussian mechanism with multiplier s: R * a / (2 s^2); epsilon = min over a of that plus the
    conversion term of dp_accounting's `compute_epsilon` (checked here against the closed form's lower bound)."""
    z, rounds, delta = 4.0, 10, 1e-5
    eps = dp.epsilon(noise_multiplier=z, num_clients=5, clients_per_round=5, rounds=rounds, target_delta=delta)
    orders = np.linspace(1.01, 200, 20000)
    classic = np.min(rounds * orders / (2 * (z / 2) ** 2) + np.log(1 / delta) / (orders - 1))
    assert 0.5 * classic < eps <= classic + 1e-6  # dp_accounting's conversion is tighter than the classic one.


def test_epsilon_grows_with_rounds_and_shrinks_with_noise():
    def eps(z, rounds, m=10):
        return dp.epsilon(noise_multiplier=z, num_clients=500, clients_per_round=m, rounds=rounds, target_delta=1e-6)

    assert eps(1.0, 0) == 0.0 and eps(0.0, 3) == math.inf
    by_rounds = [eps(1.0, r) for r in (1, 10, 100)]
    by_noise = [eps(z, 10) for z in (0.5, 1.0, 2.0)]
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 3
    assert by_noise == sorted(by_noise, reverse=True) and len(set(by_noise)) == 3
    assert eps(1.0, 10, m=10) < eps(1.0, 10, m=100)  # More sampled clients: less amplification.


# The committed MovieLens DP rows (docs/results/dp_utility_movielens.json): N = 754, 100 per round, 300 rounds.
ML_N, ML_M, ML_ROUNDS, ML_DELTA = 754, 100, 300, 1 / 754**1.1
ML_NOISE = (28.371105213982144, 11.133360051759594, 5.18316464218849)


def test_both_accountings_reproduce_the_movielens_table():
    """Replace-one without replacement gives the table's 0.994 / 2.986 / 7.901; the literature's add/remove with
    Poisson sampling gives 0.196 / 0.583 / 1.433 for the same noise (about 5x smaller)."""
    kwargs = dict(num_clients=ML_N, clients_per_round=ML_M, rounds=ML_ROUNDS, target_delta=ML_DELTA)
    ours = [dp.epsilon(noise_multiplier=z, **kwargs) for z in ML_NOISE]
    literature = [dp.epsilon_add_remove_poisson(noise_multiplier=z, **kwargs) for z in ML_NOISE]
    # The table's 5 decimals: within half a unit of the last (float64, no TF: the same on every CPU).
    assert ours == pytest.approx([0.99357, 2.98564, 7.90094], abs=5e-6)
    assert literature == pytest.approx([0.19614, 0.58265, 1.43260], abs=5e-6)


def _direct_add_remove_poisson(z, n, m, rounds, delta):
    accountant = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    event = dp_accounting.GaussianDpEvent(z)  # Add/remove: sensitivity C.
    if m < n:
        event = dp_accounting.PoissonSampledDpEvent(m / n, event)
    for _ in range(rounds):
        accountant.compose(event)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize('z, n, m, rounds', [(1.0, 1000, 10, 3), (0.8, 754, 100, 2), (3.0, 10, 10, 30)])
def test_add_remove_poisson_epsilon_equals_dp_accounting_round_by_round(z, n, m, rounds):
    ours = dp.epsilon_add_remove_poisson(
        noise_multiplier=z, num_clients=n, clients_per_round=m, rounds=rounds, target_delta=1e-5
    )
    assert ours == pytest.approx(_direct_add_remove_poisson(z, n, m, rounds, 1e-5), rel=1e-9)  # As above.
    assert ours < dp.epsilon(noise_multiplier=z, num_clients=n, clients_per_round=m, rounds=rounds, target_delta=1e-5)


def test_a_runs_add_remove_poisson_epsilon_equals_the_function():
    privacy = dp.DifferentialPrivacy(noise_multiplier=1.1, clients_per_round=20, num_clients=700, target_delta=1e-6)
    for rounds in (0, 1, 7, 300):
        expected = dp.epsilon_add_remove_poisson(
            noise_multiplier=1.1, num_clients=700, clients_per_round=20, rounds=rounds, target_delta=1e-6
        )
        assert privacy.epsilon_add_remove_poisson(rounds) == pytest.approx(expected, rel=1e-12)  # As above.
    assert (
        dp.epsilon_add_remove_poisson(
            noise_multiplier=0.0, num_clients=700, clients_per_round=20, rounds=3, target_delta=1e-6
        )
        == math.inf
    )


def test_report_and_round_metrics():
    privacy = dp.DifferentialPrivacy(noise_multiplier=1.0, clients_per_round=10, num_clients=100, target_delta=1e-4)
    metrics = privacy.round_metrics(3, {'aggregator': {'dp_query_metrics': {'clip': np.float32(0.2)}}})
    # The same function on the same (cached) RDP: exactly; the clip is the float32 reported, widened.
    assert metrics['privacy']['epsilon'] == privacy.epsilon(3)
    assert metrics['privacy']['clip'] == float(np.float32(0.2))
    report = privacy.report(3)
    assert report['epsilon'] == privacy.epsilon(3) and report['delta'] == 1e-4
    assert report['neighbouring'] == 'replace-one user' and report['clip'] == 'adaptive'
    assert '10 of 100' in report['sampling']
    assert report['epsilon_add_remove_poisson'] == privacy.epsilon_add_remove_poisson(3)
    assert report['epsilon_add_remove_poisson'] < report['epsilon']
    assert 'not a formal guarantee' in report['epsilon_add_remove_poisson_note']
    assert dp.default_target_delta(100) < 1 / 100


# ----------------------------------------------------------------------------------------- (e) config validation
@pytest.mark.parametrize(
    'kwargs, flag',
    [
        (dict(dp_noise_multiplier=-1.0), 'dp_noise_multiplier'),
        (dict(dp_clip='-0.5'), 'dp_clip'),
        (dict(dp_clip='big'), 'dp_clip'),
        (dict(dp_initial_clip=0.0), 'dp_initial_clip'),
        (dict(dp_target_quantile=1.5), 'dp_target_quantile'),
        (dict(dp_clip_learning_rate=-0.1), 'dp_clip_learning_rate'),
        (dict(dp_clipped_count_stddev=-1.0), 'dp_clipped_count_stddev'),
        (dict(dp_target_delta=0.0), 'dp_target_delta'),
        (dict(dp_target_delta=1.0), 'dp_target_delta'),
    ],
)
def test_config_errors_name_the_flag(kwargs, flag):
    with pytest.raises(errors.ConfigError, match=flag):
        config_parts.DifferentialPrivacyConfig(**kwargs)


def test_adaptive_clip_needs_count_noise_for_the_noise_multiplier():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config(config_parts.DifferentialPrivacyConfig, config_parts.SamplingConfig):
        def __post_init__(self):
            config_parts.run_post_inits(self)

    Config(dp_noise_multiplier=0.9, clients_per_round=10)  # 0.9 < 2 * 0.05 * 10.
    with pytest.raises(errors.ConfigError, match='dp_clipped_count_stddev'):
        Config(dp_noise_multiplier=1.5, clients_per_round=10)
    Config(dp_noise_multiplier=1.5, clients_per_round=10, dp_clipped_count_stddev=1.0)
    Config(dp_noise_multiplier=1.5, clients_per_round=10, dp_clip='0.5')  # Fixed clipping has no count.
    config = Config(dp_noise_multiplier=1.0, dp_clip='0.5')
    assert config.dp_enabled and config.dp_fixed_clip == 0.5
    assert not Config().dp_enabled and Config().dp_fixed_clip is None


def test_tasks_refuse_dp_for_rows_it_does_not_cover():
    from fedpersonal.tasks import furl_personalization_config as furl_config
    from fedpersonal.tasks import movielens_mf_config

    with pytest.raises(errors.ConfigError, match='dp_noise_multiplier'):
        movielens_mf_config.MovieLensMFConfig(configurations=('fedrecon', 'centralized_recon'), dp_noise_multiplier=1.0)
    movielens_mf_config.MovieLensMFConfig(configurations=('fedrecon', 'fedavg_recon'), dp_noise_multiplier=1.0)
    with pytest.raises(errors.ConfigError, match='dp_noise_multiplier'):
        furl_config.FurlConfig(dp_noise_multiplier=0.5)  # The default rows include the server rows.
    furl_config.FurlConfig(configurations=('personalized_fl',), dp_noise_multiplier=0.5)


@pytest.mark.parametrize(
    'module, name, why',
    [
        ('hpfl_user_modeling_config', 'HpflConfig', 'accuracy'),
        ('feddva_config', 'FeddvaConfig', 'model_aggregator'),
        ('next_word_prediction_config', 'NextWordPredictionConfig', 'not wired'),
    ],
)
def test_tasks_without_dp_refuse_the_flag_saying_why(module, name, why):
    import importlib

    config_cls = getattr(importlib.import_module(f'fedpersonal.tasks.{module}'), name)
    with pytest.raises(errors.ConfigError, match=f'--dp_noise_multiplier=0.5 is not supported here: .*{why}'):
        config_cls(dp_noise_multiplier=0.5, dp_clip='1.0')
    assert not config_cls().dp_enabled


# ------------------------------------------------------------------------------------ secure summation (optional)
def test_secure_sum_aggregates_fed_recon_under_dp():
    """`tff.aggregators.SecureSumFactory` (bounds [-1, 1]) as the record sum of FedRecon's DP aggregator (a clipped
    record's coordinates are within the clip, so the bounds do not change the sensitivity). TFF's local runtime has
    no secure intrinsics: ``LocalRuntime(secure_sum_in_the_clear=True)`` runs them as plain sums (TFF's test
    context), with its worker stopped on exit like any other (TFF's own test context left its worker running)."""
    import tensorflow_privacy as tfp

    from fedpersonal import runtime  # pylint: disable=g-import-not-at-top

    data = _clients([3, 12])
    secure = tff.aggregators.SecureSumFactory(upper_bound_threshold=1.0, lower_bound_threshold=-1.0)
    dp_secure = tff.aggregators.DifferentiallyPrivateFactory(
        tfp.NormalizedQuery(tfp.GaussianSumQuery(l2_norm_clip=1.0, stddev=0.0), denominator=2.0),
        record_aggregation_factory=secure,
    )
    with runtime.LocalRuntime():
        plain = _fed_recon_round(tff.aggregators.UnweightedMeanFactory(), data)
        with pytest.raises(errors.ConfigError, match=r'secure summation.*LocalRuntime\(secure_sum_in_the_clear=True\)'):
            _fed_recon_round(dp_secure, data)  # The plain runtime cannot: a clear error, not TFF's gRPC one.
    with runtime.LocalRuntime(secure_sum_in_the_clear=True):
        private = _fed_recon_round(dp_secure, data)
    assert not runtime.worker_pids_of_this_process()
    # The updates' norms are below the clip 1.0. The secure sum shifts each value by the lower bound -1 into [0, 2],
    # quantizes it to 32 bits (float32 keeps 24: rounding at that range's scale), sums the 2 clients and shifts back:
    # float32 roundings at the scale of the shifted sum (at most 4).
    bound = tolerances.reorder_bound(depth=2 + 3, scale=4.0)
    assert np.abs(plain - recon.ITEM_INIT).max() > 1e-3 > 100 * bound  # The round trained.
    np.testing.assert_allclose(private, plain, rtol=0, atol=bound)


@pytest.mark.parametrize('participation', [{'client_dropout_rate': 0.1}, {'overselection': 1.5}])
def test_dp_refuses_simulated_dropouts_and_overselection(participation):
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config(config_parts.CrossDeviceRunConfig, config_parts.DifferentialPrivacyConfig):
        pass

    config = Config(dp_noise_multiplier=1.0, dp_clip='0.5', **participation)
    with pytest.raises(errors.ConfigError, match='dp_noise_multiplier'):
        dp.DifferentialPrivacy.from_config(config, num_clients=100)
