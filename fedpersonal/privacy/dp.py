"""User-level differential privacy of the global parameters: TFF's DP aggregators and an RDP epsilon.

**Mechanism** (DP-FedAvg, McMahan et al. 2018, https://arxiv.org/abs/1710.06963): each round, every sampled
client's update of the *global* parameters is clipped to L2 norm C (fixed, or adapted privately to a quantile of
the update norms, Andrew et al. 2021, https://arxiv.org/abs/1905.03871), the clipped updates are summed, Gaussian
noise of stddev z * C is added and the sum is divided by the (fixed) number of clients per round; the server
optimizer applies the result. This is TFF's `tff.aggregators.DifferentiallyPrivateFactory` (`gaussian_fixed` /
`gaussian_adaptive`, the latter what `tff.learning.dp_aggregator` builds), an *unweighted* aggregator: under DP
every client has weight 1 (`tff.learning.ClientWeighting.UNIFORM`), since a weight by example count would let one
user move the mean by more than C / clients_per_round. `build_dp_aggregator` builds it; an algorithm's builder takes
it as its ``model_aggregator`` (`fedpersonal.core.compose` applies it to `ClientResult.update`, the global update
only). With a fixed clip it is a `FixedClipDpFactory`, which FedRecon, FedAvg and FURL on the fast simulation engine apply
to each logical client (a group reports the sum of its clients' clipped updates; `simulation.group`), tested equal
to the per-client path; adaptive clipping, and DP in the other algorithms, run on the per-client TFF path
(`DifferentialPrivacy.simulation`).

**Accounting** (`epsilon`): `dp_accounting`'s RDP accountant (`dp_accounting.rdp.RdpAccountant`) composing, over the
rounds run, one event per round of the sampling the training loop really does (`program.sample_clients`): a
uniformly random subset of fixed size m = clients_per_round of the N training clients, drawn without replacement
and independently each round, i.e. ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z / 2))``; when every
client takes part in every round (m >= N, cross-silo) the round is the un-sampled ``GaussianDpEvent(z / 2)``.
Assumptions:

* the unit of privacy is a **user** (one client, all its data): user-level DP;
* the neighbouring relation is **replace-one user** (N is public), the relation dp_accounting requires for sampling
  without replacement (Wang, Balle, Kasiviswanathan 2019, https://arxiv.org/abs/1808.00087, Theorem 27). Replacing a
  user changes its clipped update by up to 2C, so the noise stddev z * C is z / 2 times the sensitivity: the
  accountant's Gaussian noise multiplier is z / 2 (the same for adaptive clipping, whose clipped-count bit also
  moves by twice its add/remove sensitivity; TFF's z there is the effective multiplier of both queries);
* the round's sample and the noise are secret. In these simulations both derive from the run's ``--seed``
  (`sample_clients`; with a fixed clip the noise too, `SeededGaussianSumQuery`, so such runs are reproducible and
  resume exactly); adaptive clipping draws its noise with tensorflow_privacy's unseeded TF random ops, as TFF does
  (not bit-reproducible);
* epsilon covers every round run (all intermediate global models, checkpoints included), at ``target_delta``
  (default ``1 / N**1.1``, below 1 / N); the epsilon of R rounds is reported after each round (``privacy/epsilon``).

**The literature's accounting** (`epsilon_add_remove_poisson`): most DP-FedAvg papers report epsilon for
**add/remove-one user** neighbours and **Poisson** sampling (each client independently with probability
q = m / N), i.e. ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` (sensitivity C, so the accountant's multiplier is
z itself). For the same noise it is several times smaller than the replace-one epsilon above (DP-FedAvg on 754
clients, 100 per round, 300 rounds, z = 5.18: 1.43 against 7.90). Reported beside `epsilon` for comparison with
published tables; it is *not* a formal guarantee of these runs: their sampling is fixed-size without replacement,
not Poisson (fixed-size sampling accounted as Poisson is what much of the literature does). The mean's
denominator m is already what a Poisson analysis needs: the expected sample size q * N, fixed, not the count drawn.

**Not covered** by epsilon: local/private parameters (FedRecon's reconstructed locals, FURL's private embeddings)
never leave the client and never enter the aggregator (only with FedRecon's opt-in ``learn_local_init`` does their
displacement, which then *is* clipped and noised with the global update); the training metrics (loss, example
counts) and every evaluation (validation/test metrics, model selection and early stopping on them) are aggregated
without noise and released as they are; centralized rows see the raw data.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Any

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp
from absl import logging

from fedpersonal import errors

NEIGHBOURING = 'replace-one user'
ACCOUNTANT = 'RDP (dp_accounting.rdp.RdpAccountant)'
ADD_REMOVE_POISSON_NOTE = (
    "the literature's convention (add/remove-one user, Poisson sampling at q = clients_per_round / num_clients, "
    'accountant noise multiplier z), for comparison with published tables; not a formal guarantee of this run, '
    'whose sampling is fixed-size without replacement (epsilon is its bound)'
)
NOT_COVERED = (
    'local/private parameters never leave the client (not aggregated)',
    'training and evaluation metrics are aggregated and released without noise',
    'model selection and early stopping on validation metrics',
)


class SeededGaussianSumQuery(tfp.GaussianSumQuery):
    """tensorflow_privacy's `GaussianSumQuery` with stateless noise: the global state carries a seed
    ``[noise_seed, round]`` (advanced every round, checkpointed with the process state), so a run's noise is a
    function of `noise_seed` and the round, and a resumed run draws the noise of an uninterrupted one.

    For simulations: a deployment must draw its noise from a secret source (the seed is in the run's config).
    """

    _SeededGlobalState = collections.namedtuple('_SeededGlobalState', ['l2_norm_clip', 'stddev', 'seed'])

    def __init__(self, l2_norm_clip: float, stddev: float, noise_seed: int):
        super().__init__(l2_norm_clip, stddev)
        self._noise_seed = int(noise_seed)

    def initial_global_state(self):
        return self._SeededGlobalState(
            tf.cast(self._l2_norm_clip, tf.float32),
            tf.cast(self._stddev, tf.float32),
            tf.constant([self._noise_seed, 0], tf.int64),
        )

    def get_noised_result(self, sample_state, global_state):
        flat = tf.nest.flatten(sample_state)
        seeds = tf.random.experimental.stateless_split(global_state.seed, num=max(len(flat), 1))
        noised = [
            v + tf.cast(tf.random.stateless_normal(tf.shape(v), seed=seeds[i], stddev=global_state.stddev), v.dtype)
            for i, v in enumerate(flat)
        ]
        new_state = global_state._replace(seed=global_state.seed + tf.constant([0, 1], tf.int64))
        event = dp_accounting.GaussianDpEvent(global_state.stddev / global_state.l2_norm_clip)
        return tf.nest.pack_sequence_as(sample_state, noised), new_state, event


class FixedClipDpFactory(tff.aggregators.DifferentiallyPrivateFactory):
    """`DifferentiallyPrivateFactory.gaussian_fixed` (seeded or not) that also states its clip, noise and
    denominator, so that the fast simulation engine can apply it to each logical client (`for_client_slots`).

    As a TFF factory it is exactly ``gaussian_fixed(noise_multiplier, clients_per_round, clip)`` (with
    `SeededGaussianSumQuery` when `noise_seed` is given): each client update clipped to L2 norm `clip`, summed,
    Gaussian noise of stddev ``noise_multiplier * clip``, divided by `clients_per_round`.

    Args:
      clip: C, the L2 clip of one client's update.
      noise_multiplier: z (stddev z * C).
      clients_per_round: The denominator.
      noise_seed: Draw the noise with `SeededGaussianSumQuery` (reproducible); None: TF's unseeded random ops.
      clients_per_slot: How many logical clients one TFF client slot carries (the engine's group size): the slot's
        record, the sum of its clients' updates each clipped to C, is clipped to ``clients_per_slot * C`` (a
        bound it always meets: no second clipping), while the noise stays ``z * C``.
    """

    def __init__(
        self,
        *,
        clip: float,
        noise_multiplier: float,
        clients_per_round: int | float,
        noise_seed: int | None = None,
        clients_per_slot: int = 1,
    ):
        tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(  # Validates the arguments as TFF does.
            noise_multiplier=float(noise_multiplier), clients_per_round=float(clients_per_round), clip=float(clip)
        )
        self.clip, self.noise_multiplier = float(clip), float(noise_multiplier)
        self.clients_per_round, self.noise_seed = float(clients_per_round), noise_seed
        slot_clip, stddev = float(clip) * int(clients_per_slot), float(clip) * float(noise_multiplier)
        if noise_seed is None:
            query = tfp.GaussianSumQuery(l2_norm_clip=slot_clip, stddev=stddev)
        else:
            query = SeededGaussianSumQuery(slot_clip, stddev, noise_seed)
        super().__init__(tfp.NormalizedQuery(query, denominator=self.clients_per_round))

    def for_client_slots(self, clients_per_slot: int) -> FixedClipDpFactory:
        """The same mechanism for slots carrying up to `clients_per_slot` logical clients, each clipped to C."""
        return FixedClipDpFactory(
            clip=self.clip,
            noise_multiplier=self.noise_multiplier,
            clients_per_round=self.clients_per_round,
            noise_seed=self.noise_seed,
            clients_per_slot=clients_per_slot,
        )


def build_dp_aggregator(
    *,
    noise_multiplier: float,
    clients_per_round: int,
    clip: float | None = None,
    initial_clip: float = 0.1,
    target_quantile: float = 0.5,
    clip_learning_rate: float = 0.2,
    clipped_count_stddev: float | None = None,
    noise_seed: int | None = None,
) -> tff.aggregators.UnweightedAggregationFactory:
    """TFF's DP mean: clip each client update, sum, add Gaussian noise, divide by `clients_per_round`.

    Args:
      noise_multiplier: z: the noise stddev over the clip norm (0: clipping only).
      clients_per_round: The denominator of the mean (the clients sampled per round).
      clip: A fixed L2 clip norm (`DifferentiallyPrivateFactory.gaussian_fixed`, as a `FixedClipDpFactory`, which
        the fast simulation engine applies per logical client); None: adaptive clipping (`gaussian_adaptive` with
        the following options, TFF's defaults; per-client path only).
      initial_clip: Adaptive: the initial clip norm.
      target_quantile: Adaptive: the fraction of updates the clip aims to leave unclipped.
      clip_learning_rate: Adaptive: the learning rate of the geometric clip update.
      clipped_count_stddev: Adaptive: the noise stddev of the clipped count (None: 0.05 * clients_per_round).
      noise_seed: Fixed clip only: draw the noise with `SeededGaussianSumQuery` (reproducible runs); None: TF's
        unseeded random ops, as TFF does (adaptive clipping always).

    Returns:
      An unweighted `tff.aggregators` factory; use it with ``client_weighting=UNIFORM``.

    Raises:
      ConfigError: parameters TFF rejects (e.g. an adaptive clip whose count noise is too small for z).
    """
    try:
        if clip is not None:
            return FixedClipDpFactory(
                clip=clip, noise_multiplier=noise_multiplier, clients_per_round=clients_per_round, noise_seed=noise_seed
            )
        return tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
            noise_multiplier=float(noise_multiplier),
            clients_per_round=float(clients_per_round),
            initial_l2_norm_clip=float(initial_clip),
            target_unclipped_quantile=float(target_quantile),
            learning_rate=float(clip_learning_rate),
            clipped_count_stddev=None if clipped_count_stddev is None else float(clipped_count_stddev),
        )
    except ValueError as e:
        raise errors.ConfigError(f'Differential privacy (--dp_* flags): {e}') from e


def default_target_delta(num_clients: int) -> float:
    """``1 / num_clients**1.1``: below 1 / N, as (epsilon, delta)-DP with delta >= 1 / N allows leaking a user."""
    return 1.0 / float(num_clients) ** 1.1


def round_event(
    *, noise_multiplier: float, num_clients: int, clients_per_round: int, add_remove_poisson: bool = False
) -> dp_accounting.DpEvent:
    """The `dp_accounting` event of one round (module docstring): replace-one, sensitivity 2C, sampling without
    replacement; with `add_remove_poisson` the literature's: noise z, Poisson sampling at q = m / N."""
    if num_clients < 1 or clients_per_round < 1:
        raise ValueError(f'num_clients and clients_per_round must be >= 1, got {num_clients}, {clients_per_round}.')
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier if add_remove_poisson else noise_multiplier / 2.0)
    if clients_per_round >= num_clients:
        return gaussian  # Every client every round.
    if add_remove_poisson:
        return dp_accounting.PoissonSampledDpEvent(clients_per_round / num_clients, gaussian)
    return dp_accounting.SampledWithoutReplacementDpEvent(num_clients, clients_per_round, gaussian)


def _relation(add_remove_poisson: bool) -> dp_accounting.NeighboringRelation:
    relation = dp_accounting.NeighboringRelation
    return relation.ADD_OR_REMOVE_ONE if add_remove_poisson else relation.REPLACE_ONE


def _epsilon(add_remove_poisson: bool, noise_multiplier: float, rounds: int, target_delta: float, **sampling) -> float:
    if rounds < 0:
        raise ValueError(f'rounds must be >= 0, got {rounds}.')
    if rounds == 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=_relation(add_remove_poisson))
    event = round_event(noise_multiplier=noise_multiplier, add_remove_poisson=add_remove_poisson, **sampling)
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return float(accountant.get_epsilon(target_delta))


def epsilon(
    *, noise_multiplier: float, num_clients: int, clients_per_round: int, rounds: int, target_delta: float
) -> float:
    """The epsilon of `rounds` DP rounds at `target_delta` (RDP accountant, replace-one user; module docstring).

    Returns 0.0 for no rounds and inf for noise_multiplier 0.

    Example:

    >>> round(epsilon(noise_multiplier=1.0, num_clients=1000, clients_per_round=10, rounds=100, target_delta=1e-5), 2)
    11.21
    """
    sampling = {'num_clients': num_clients, 'clients_per_round': clients_per_round}
    return _epsilon(False, noise_multiplier, rounds, target_delta, **sampling)


def epsilon_add_remove_poisson(
    *, noise_multiplier: float, num_clients: int, clients_per_round: int, rounds: int, target_delta: float
) -> float:
    """The epsilon of `rounds` rounds as most DP-FedAvg papers report it: add/remove-one user, Poisson sampling.

    RDP accountant with ``NeighboringRelation.ADD_OR_REMOVE_ONE`` composing
    ``PoissonSampledDpEvent(clients_per_round / num_clients, GaussianDpEvent(noise_multiplier))`` over the rounds
    (the un-sampled Gaussian when every client takes part). For comparison with published tables only: these
    runs sample a fixed-size subset without replacement, for which `epsilon` is the formal bound (module docstring).

    Returns 0.0 for no rounds and inf for noise_multiplier 0.

    Example:

    >>> round(epsilon_add_remove_poisson(
    ...     noise_multiplier=5.18, num_clients=754, clients_per_round=100, rounds=300, target_delta=6.84e-4), 2)
    1.43
    """
    sampling = {'num_clients': num_clients, 'clients_per_round': clients_per_round}
    return _epsilon(True, noise_multiplier, rounds, target_delta, **sampling)


def _find(metrics: Any, key: str) -> Any:
    """The first value under `key` in nested mappings (depth first), or None."""
    if isinstance(metrics, dict) or hasattr(metrics, 'items'):
        for k, v in metrics.items():
            if k == key and not hasattr(v, 'items'):
                return v
            found = _find(v, key)
            if found is not None:
                return found
    return None


@dataclasses.dataclass(frozen=True)
class DifferentialPrivacy:
    """The DP of one federated run: its aggregator, its per-round privacy metrics and its final report.

    Build it with `from_config`; `None` there means no DP.
    """

    noise_multiplier: float
    clients_per_round: int
    num_clients: int
    target_delta: float
    clip: float | None = None
    initial_clip: float = 0.1
    target_quantile: float = 0.5
    clip_learning_rate: float = 0.2
    clipped_count_stddev: float | None = None
    noise_seed: int | None = None

    @classmethod
    def from_config(
        cls, config: Any, *, num_clients: int, clients_per_round: int | None = None
    ) -> DifferentialPrivacy | None:
        """The DP of a config with `config_parts.DifferentialPrivacyConfig` (None when it is off).

        Args:
          config: The task config.
          num_clients: N, the clients sampled from (the training clients).
          clients_per_round: Default ``config.clients_per_round``, capped at N (as `sample_clients` does).

        Raises:
          fedpersonal.errors.ConfigError: DP together with simulated dropouts or over-selection (the accountant
            assumes a fixed-size sample of clients_per_round clients, every one of which reports).
        """
        if config.dp_noise_multiplier is None:
            return None
        if getattr(config, 'client_dropout_rate', 0.0) or getattr(config, 'overselection', 1.0) != 1.0:
            raise errors.ConfigError(
                '--dp_noise_multiplier cannot be combined with --client_dropout_rate or --overselection: the '
                'epsilon accountant assumes a fixed-size sample of --clients_per_round clients that all report.'
            )
        per_round = min(clients_per_round or config.clients_per_round, num_clients)
        return cls(
            noise_multiplier=float(config.dp_noise_multiplier),
            clients_per_round=per_round,
            num_clients=num_clients,
            target_delta=config.dp_target_delta or default_target_delta(num_clients),
            clip=config.dp_fixed_clip,
            initial_clip=config.dp_initial_clip,
            target_quantile=config.dp_target_quantile,
            clip_learning_rate=config.dp_clip_learning_rate,
            clipped_count_stddev=config.dp_clipped_count_stddev,
            noise_seed=getattr(config, 'seed', 0) if config.dp_fixed_clip is not None else None,
        )

    def aggregator(self) -> tff.aggregators.UnweightedAggregationFactory:
        """The DP aggregator (`build_dp_aggregator`)."""
        return build_dp_aggregator(
            noise_multiplier=self.noise_multiplier,
            clients_per_round=self.clients_per_round,
            clip=self.clip,
            initial_clip=self.initial_clip,
            target_quantile=self.target_quantile,
            clip_learning_rate=self.clip_learning_rate,
            clipped_count_stddev=self.clipped_count_stddev,
            noise_seed=self.noise_seed,
        )

    @property
    def client_weighting(self) -> Any:
        """UNIFORM: the DP aggregator is unweighted."""
        return tff.learning.ClientWeighting.UNIFORM

    def simulation(self, requested: str, name: str = '', *, engine_clips_per_client: bool = False) -> str:
        """The simulation to run: `requested`, unless it is the engine and the engine cannot clip each logical
        client's update here (adaptive clipping, or an algorithm without `engine_clips_per_client`): 'per_client'.
        """
        if requested == 'per_client' or (engine_clips_per_client and self.clip is not None):
            return requested
        logging.info(
            '[%s] differential privacy clips every client update%s: running the per-client TFF path instead of '
            '--simulation=%s.',
            name,
            ' adaptively' if self.clip is None and engine_clips_per_client else '',
            requested,
        )
        return 'per_client'

    @property
    def sampling(self) -> str:
        if self.clients_per_round >= self.num_clients:
            return f'every client every round ({self.num_clients} clients, no amplification by sampling)'
        return (
            f'fixed-size uniform without replacement: {self.clients_per_round} of {self.num_clients} clients per round'
        )

    @functools.cached_property
    def _round_rdp(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(orders, the RDP of one round at each) of dp_accounting's accountant, or None if it hides them."""
        return self._one_round_rdp(add_remove_poisson=False)

    @functools.cached_property
    def _round_rdp_add_remove_poisson(self) -> tuple[np.ndarray, np.ndarray] | None:
        """`_round_rdp` under the literature's convention (`epsilon_add_remove_poisson`)."""
        return self._one_round_rdp(add_remove_poisson=True)

    def _one_round_rdp(self, *, add_remove_poisson: bool) -> tuple[np.ndarray, np.ndarray] | None:
        accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=_relation(add_remove_poisson))
        accountant.compose(
            round_event(
                noise_multiplier=self.noise_multiplier,
                num_clients=self.num_clients,
                clients_per_round=self.clients_per_round,
                add_remove_poisson=add_remove_poisson,
            )
        )
        rdp, orders = getattr(accountant, '_rdp', None), getattr(accountant, '_orders', None)
        return None if rdp is None or orders is None else (np.asarray(orders), np.asarray(rdp))

    @property
    def event(self) -> dp_accounting.DpEvent:
        """The dp_accounting event of one round (`round_event`)."""
        return round_event(
            noise_multiplier=self.noise_multiplier,
            num_clients=self.num_clients,
            clients_per_round=self.clients_per_round,
        )

    def epsilon(self, rounds: int) -> float:
        """The epsilon after `rounds` rounds at `target_delta`: `epsilon`, computed once per run.

        RDP composes additively, so R rounds have R times the one-round RDP; the one-round RDP (the costly part,
        about a second) is computed once and converted with dp_accounting's `compute_epsilon`, as its accountant's
        `get_epsilon` does (tests/privacy/dp_test.py checks it equals `epsilon`).
        """
        return self._epsilon(rounds, add_remove_poisson=False)

    def epsilon_add_remove_poisson(self, rounds: int) -> float:
        """`epsilon_add_remove_poisson` of `rounds` rounds (one-round RDP computed once, as in `epsilon`)."""
        return self._epsilon(rounds, add_remove_poisson=True)

    def _epsilon(self, rounds: int, *, add_remove_poisson: bool) -> float:
        round_rdp = None
        if rounds != 0 and self.noise_multiplier > 0:
            round_rdp = self._round_rdp_add_remove_poisson if add_remove_poisson else self._round_rdp
        if round_rdp is None:
            sampling = {'num_clients': self.num_clients, 'clients_per_round': self.clients_per_round}
            return _epsilon(add_remove_poisson, self.noise_multiplier, rounds, self.target_delta, **sampling)
        orders, rdp = round_rdp
        return float(dp_accounting.rdp.compute_epsilon(orders, rounds * rdp, self.target_delta)[0])

    def round_metrics(self, round_num: int, process_metrics: Any = None) -> dict[str, Any]:
        """``{'privacy': {'epsilon': ..., 'clip': ...}}`` released with round `round_num` (the training loop's
        ``round_metrics_fn``); ``clip`` is the adaptive clip norm the aggregator reports (or the fixed one)."""
        privacy: dict[str, Any] = {'epsilon': self.epsilon(round_num)}
        clip = self.clip if self.clip is not None else _find(process_metrics or {}, 'clip')
        if clip is not None:
            privacy['clip'] = float(clip)
        return {'privacy': privacy}

    def report(self, rounds: int) -> dict[str, Any]:
        """What a results file records: epsilon, delta, noise, clip, sampling and the accountant's assumptions."""
        return {
            'epsilon': self.epsilon(rounds),
            'delta': self.target_delta,
            'rounds': rounds,
            'noise_multiplier': self.noise_multiplier,
            'clip': self.clip if self.clip is not None else 'adaptive',
            **(
                {}
                if self.clip is not None
                else {
                    'initial_clip': self.initial_clip,
                    'target_quantile': self.target_quantile,
                    'clip_learning_rate': self.clip_learning_rate,
                    'clipped_count_stddev': (
                        self.clipped_count_stddev
                        if self.clipped_count_stddev is not None
                        else (0.05 * self.clients_per_round if self.noise_multiplier > 0 else 0.0)
                    ),
                }
            ),
            'clients_per_round': self.clients_per_round,
            'num_clients': self.num_clients,
            'client_weighting': 'uniform',
            'unit': 'user (client)',
            'neighbouring': NEIGHBOURING,
            'sampling': self.sampling,
            'accountant': ACCOUNTANT,
            'accountant_noise_multiplier': self.noise_multiplier / 2.0,
            'epsilon_add_remove_poisson': self.epsilon_add_remove_poisson(rounds),
            'epsilon_add_remove_poisson_note': ADD_REMOVE_POISSON_NOTE,
            'noise': (
                f'stateless, seeded by the run seed {self.noise_seed} and the round (simulation only)'
                if self.noise_seed is not None
                else "TensorFlow's unseeded random ops (not reproducible)"
            ),
            'protects': 'global parameters (every released global model)',
            'not_covered': list(NOT_COVERED),
        }


def format_report(privacy: dict[str, Any] | None) -> str:
    """One line of a run's privacy for a printed report ('' without DP)."""
    if not privacy:
        return ''
    eps = privacy.get('epsilon')
    eps_text = 'inf' if eps is None or eps == math.inf else f'{eps:.3g}'
    clip = privacy['clip']
    literature = privacy.get('epsilon_add_remove_poisson')
    literature_text = (
        ''
        if literature is None
        else f" (epsilon {literature:.3g} as most papers account: add/remove-one, Poisson sampling; not this run's bound)"
    )
    return (
        f'DP: ({eps_text}, {privacy["delta"]:.3g})-DP after {privacy["rounds"]} rounds, user-level, '
        f'{privacy["neighbouring"]}{literature_text}; noise multiplier {privacy["noise_multiplier"]}, clip {clip}; '
        f'{privacy["sampling"]}; {privacy["accountant"]}. Not covered: {"; ".join(privacy["not_covered"])}.'
    )
