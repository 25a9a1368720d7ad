"""The epsilon of user-level DP-FedAvg rounds: `dp_accounting`'s RDP accountant (`fedpersonal.privacy.dp` runs it).

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
  (`sample_clients`; with a fixed clip the noise too,
  `fedpersonal.privacy.dp_aggregators.SeededGaussianSumQuery`, so such runs are reproducible and
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
"""

from __future__ import annotations

import math

import dp_accounting

NEIGHBOURING = 'replace-one user'
ACCOUNTANT = 'RDP (dp_accounting.rdp.RdpAccountant)'
ADD_REMOVE_POISSON_NOTE = (
    "the literature's convention (add/remove-one user, Poisson sampling at q = clients_per_round / num_clients, "
    'accountant noise multiplier z), for comparison with published tables; not a formal guarantee of this run, '
    'whose sampling is fixed-size without replacement (epsilon is its bound)'
)


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


def neighboring_relation(add_remove_poisson: bool) -> dp_accounting.NeighboringRelation:
    """The accountant's neighbouring relation: replace-one, or the literature's add/remove-one."""
    relation = dp_accounting.NeighboringRelation
    return relation.ADD_OR_REMOVE_ONE if add_remove_poisson else relation.REPLACE_ONE


def _epsilon(add_remove_poisson: bool, noise_multiplier: float, rounds: int, target_delta: float, **sampling) -> float:
    if rounds < 0:
        raise ValueError(f'rounds must be >= 0, got {rounds}.')
    if rounds == 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=neighboring_relation(add_remove_poisson))
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
