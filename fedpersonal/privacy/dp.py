"""User-level differential privacy of the global parameters: one run's DP (`DifferentialPrivacy`).

A run with ``--dp_noise_multiplier`` aggregates the global update with TFF's DP mean
(`fedpersonal.privacy.dp_aggregators`: each client's update clipped, summed, Gaussian noise added, divided by the
clients per round; unweighted, so every client has weight 1) and reports, after every round, the epsilon of the rounds
run (`fedpersonal.privacy.accounting`: RDP, replace-one user, fixed-size sampling without replacement; beside it the
literature's add/remove-one, Poisson epsilon for comparison). `DifferentialPrivacy` holds one run's parameters and
gives its aggregator, its per-round privacy metrics and its final report; this module also re-exports the
aggregators' and the accounting's public names (``dp.epsilon``, ``dp.build_dp_aggregator``, ...).

**Not covered** by epsilon: local/private parameters (FedRecon's reconstructed locals, FURL's private embeddings)
never leave the client and never enter the aggregator (only with FedRecon's opt-in ``learn_local_init`` does their
displacement, which then *is* clipped and noised with the global update); the training metrics (loss, example
counts) and every evaluation (validation/test metrics, model selection and early stopping on them) are aggregated
without noise and released as they are; centralized rows see the raw data.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import dp_accounting
import numpy as np
import tensorflow_federated as tff
from absl import logging

from fedpersonal import errors
from fedpersonal.privacy import accounting
from fedpersonal.privacy.accounting import ACCOUNTANT as ACCOUNTANT
from fedpersonal.privacy.accounting import ADD_REMOVE_POISSON_NOTE as ADD_REMOVE_POISSON_NOTE
from fedpersonal.privacy.accounting import NEIGHBOURING as NEIGHBOURING
from fedpersonal.privacy.accounting import default_target_delta as default_target_delta
from fedpersonal.privacy.accounting import epsilon as epsilon
from fedpersonal.privacy.accounting import epsilon_add_remove_poisson as epsilon_add_remove_poisson
from fedpersonal.privacy.accounting import round_event as round_event
from fedpersonal.privacy.dp_aggregators import FixedClipDpFactory as FixedClipDpFactory
from fedpersonal.privacy.dp_aggregators import SeededGaussianSumQuery as SeededGaussianSumQuery
from fedpersonal.privacy.dp_aggregators import build_dp_aggregator as build_dp_aggregator

NOT_COVERED = (
    'local/private parameters never leave the client (not aggregated)',
    'training and evaluation metrics are aggregated and released without noise',
    'model selection and early stopping on validation metrics',
)


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
        accountant = dp_accounting.rdp.RdpAccountant(
            neighboring_relation=accounting.neighboring_relation(add_remove_poisson)
        )
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

        Example:

        >>> privacy = DifferentialPrivacy(noise_multiplier=1.0, clients_per_round=10, num_clients=1000, target_delta=1e-5)
        >>> round(privacy.epsilon(100), 2), round(epsilon(
        ...     noise_multiplier=1.0, num_clients=1000, clients_per_round=10, rounds=100, target_delta=1e-5), 2)
        (11.21, 11.21)
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
            epsilon_of = accounting.epsilon_add_remove_poisson if add_remove_poisson else accounting.epsilon
            return epsilon_of(
                noise_multiplier=self.noise_multiplier,
                num_clients=self.num_clients,
                clients_per_round=self.clients_per_round,
                rounds=rounds,
                target_delta=self.target_delta,
            )
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
