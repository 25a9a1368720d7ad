"""HPFL's federated baselines and its own variants as named `RoundSpec`s (Wu et al., WWW 2021, Table "Accuracy
performances"): a method name is a configuration of the one builder, `process.build_process`.

In every baseline the **public components** (``skill_W``, ``know_W``, ``relative_M``) are the shared model and the
**private components** (user and item tables, discrimination, slip, guess) stay on their client: they are the
CLIENTS-placed private state (the same `ClientState` as HPFL), trained locally and never sent, raw or clustered.

* ``distributed``: local training only (nothing aggregated): ``RoundSpec()``.
* ``fedsgd``: the client computes the gradient of its mean train loss at (global public, own private) in one pass
  (``client_epochs`` is ignored), takes one client-optimizer step on its private components and uploads the public
  gradient; the server averages (weighted by examples) and applies the server optimizer (SGD, learning rate 1).
* ``fedavg``: ``client_epochs`` local epochs from the broadcast public components; weighted mean of the updates
  (`tff.aggregators.MeanFactory`, or ``model_aggregator``); server SGD with learning rate 1 (model averaging).
* ``fednoise``: FedAvg whose clients add Gaussian noise N(0, ``noise_stddev``^2) to every coordinate of their upload
  (seeded by the client's `ClientData.seed` and the round; TFF's DP aggregators add calibrated noise to the *sum*
  at the server instead, a different method: pass ``model_aggregator=tff.aggregators.DifferentiallyPrivateFactory
  ...`` to FedAvg for that).
* ``fedprox``: FedAvg with the proximal term ``proximal_strength / 2 * ||public - global||^2`` in the local loss.
* ``fedatt`` (attentive aggregation, Ji et al. 2019): FedAvg's upload aggregated by
  `aggregation.AttentionMeanFactory` (per public tensor, ``alpha_il = softmax_i(-||w_l - w_il||)``) and a server
  SGD step with learning rate ``eps`` = ``attention_step``.

HPFL's variants (`HPFL_VARIANTS`): ``hpfl`` and ``hpfl_inverse`` (both aggregations; published distance weighting
of the global centres, or inverse distance), ``hpfl_k`` (public aggregation only) and ``hpfl_r`` (clustered
private aggregation only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow_federated as tff

from fedpersonal.algorithms.hpfl.process import build_process
from fedpersonal.algorithms.hpfl.spec import RoundSpec
from fedpersonal.core.process import PersonalizedProcess
from fedpersonal.models import gum

BASELINES = ('distributed', 'fedsgd', 'fedavg', 'fednoise', 'fedprox', 'fedatt')
HPFL_VARIANTS = ('hpfl_k', 'hpfl_r', 'hpfl', 'hpfl_inverse')


def round_spec(
    method: str,
    *,
    proximal_strength: float = 0.01,
    noise_stddev: float = 0.01,
    attention_step: float = 1.0,
    accuracy_threshold: float = 0.5,
    center_weighting: str = 'distance',
) -> RoundSpec:
    """The `RoundSpec` of a named method (one of `BASELINES` or `HPFL_VARIANTS`).

    Args:
      method: The method.
      proximal_strength: FedProx's mu.
      noise_stddev: Fednoise's upload noise standard deviation.
      attention_step: FedAtt's eps (its server learning rate).
      accuracy_threshold: HPFL's p.
      center_weighting: The weighting of the global centres of ``hpfl_k``/``hpfl_r`` (``hpfl`` is 'distance' and
        ``hpfl_inverse`` 'inverse_distance').
    """

    def fedavg(**changes: Any) -> RoundSpec:
        return dataclasses.replace(RoundSpec(start='global', public_aggregation='mean'), **changes)

    def hpfl(public: bool, private: bool, weighting: str = center_weighting) -> RoundSpec:
        return RoundSpec(
            public_aggregation='accuracy_weighted' if public else 'none',
            private_aggregation='clustered' if private else 'none',
            accuracy_threshold=accuracy_threshold,
            center_weighting=weighting,
        )

    specs: dict[str, Callable[[], RoundSpec]] = {
        'distributed': RoundSpec,
        'fedsgd': lambda: fedavg(local_update='gradient'),
        'fedavg': fedavg,
        'fednoise': lambda: fedavg(upload_noise_stddev=noise_stddev),
        'fedprox': lambda: fedavg(proximal_strength=proximal_strength),
        'fedatt': lambda: fedavg(public_aggregation='attention', server_learning_rate=attention_step),
        'hpfl_k': lambda: hpfl(public=True, private=False),
        'hpfl_r': lambda: hpfl(public=False, private=True),
        'hpfl': lambda: hpfl(public=True, private=True, weighting='distance'),
        'hpfl_inverse': lambda: hpfl(public=True, private=True, weighting='inverse_distance'),
    }
    if method not in specs:
        raise ValueError(f'method must be one of {BASELINES + HPFL_VARIANTS}, got {method!r}.')
    return specs[method]()


def build_method(
    method: str,
    config: gum.GumConfig,
    *,
    proximal_strength: float = 0.01,
    noise_stddev: float = 0.01,
    attention_step: float = 1.0,
    accuracy_threshold: float = 0.5,
    center_weighting: str = 'distance',
    **kwargs,
) -> PersonalizedProcess:
    """`build_process` with the `round_spec` of `method`; other keyword arguments go to `build_process`."""
    for name, value in (
        ('proximal_strength', proximal_strength),
        ('noise_stddev', noise_stddev),
        ('attention_step', attention_step),
    ):
        if value < 0:
            raise ValueError(f'{name} must be >= 0, got {value}.')
    spec = round_spec(
        method,
        proximal_strength=proximal_strength,
        noise_stddev=noise_stddev,
        attention_step=attention_step,
        accuracy_threshold=accuracy_threshold,
        center_weighting=center_weighting,
    )
    return build_process(config, spec, name=method, **kwargs)


def build_baseline(
    method: str,
    config: gum.GumConfig,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer | None = None,
    client_epochs: int = 1,
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    model_aggregator: tff.aggregators.WeightedAggregationFactory | None = None,
    proximal_strength: float = 0.01,
    noise_stddev: float = 0.01,
    attention_step: float = 1.0,
    public_seed: int = 0,
    row_updates: str = 'dense',
) -> PersonalizedProcess:
    """Builds one of `BASELINES` (see the module docstring).

    Args:
      method: One of `BASELINES`.
      config: The GUM config.
      client_optimizer: Local optimizer (default Adam, learning rate 0.01).
      client_epochs: Local epochs per round (ignored by FedSGD).
      server_optimizer: Applied to the aggregated update (default SGD with learning rate 1; FedAtt: learning rate
        ``attention_step``).
      model_aggregator: Weighted `tff.aggregators` factory of the updates for FedSGD/FedAvg/Fednoise/FedProx
        (default `tff.aggregators.MeanFactory()`); FedAtt aggregates with its attention.
      proximal_strength: FedProx's mu.
      noise_stddev: Fednoise's standard deviation of the noise added to every uploaded coordinate.
      attention_step: FedAtt's eps.
      public_seed: Seed of the initial public components.
      row_updates: Local table updates, ``'lazy'`` or ``'dense'`` (FedSGD's single full-batch step is the same
        either way).

    Returns:
      A `PersonalizedProcess`: the same round as HPFL's, configured by `round_spec(method)` (no private aggregation).

    Example:

    >>> from fedpersonal.algorithms import hpfl
    >>> from fedpersonal.models import gum
    >>> config = gum.GumConfig(num_attributes=3, max_users=5, max_items=4, hidden_dim=2)
    >>> process = hpfl.build_baseline('fedprox', config, proximal_strength=0.1)
    >>> process.parts['spec'].proximal_strength, process.parts['spec'].public_aggregation
    (0.1, 'mean')
    """
    if method not in BASELINES:
        raise ValueError(f'method must be one of {BASELINES}, got {method!r}.')
    return build_method(
        method,
        config,
        proximal_strength=proximal_strength,
        noise_stddev=noise_stddev,
        attention_step=attention_step,
        client_optimizer=client_optimizer,
        client_epochs=client_epochs,
        server_optimizer=server_optimizer,
        model_aggregator=model_aggregator,
        public_seed=public_seed,
        row_updates=row_updates,
    )


def build_distributed(config: gum.GumConfig, **kwargs) -> PersonalizedProcess:
    """Local training only (no communication)."""
    return build_baseline('distributed', config, **kwargs)


def build_fedsgd(config: gum.GumConfig, **kwargs) -> PersonalizedProcess:
    """FedSGD on the public components; private components stay local."""
    return build_baseline('fedsgd', config, **kwargs)


def build_fedavg(config: gum.GumConfig, **kwargs) -> PersonalizedProcess:
    """FedAvg on the public components; private components stay local."""
    return build_baseline('fedavg', config, **kwargs)


def build_fednoise(config: gum.GumConfig, **kwargs) -> PersonalizedProcess:
    """FedAvg with Gaussian noise on every client upload; private components stay local."""
    return build_baseline('fednoise', config, **kwargs)


def build_fedprox(config: gum.GumConfig, **kwargs) -> PersonalizedProcess:
    """FedProx (proximal local loss) on the public components; private components stay local."""
    return build_baseline('fedprox', config, **kwargs)


def build_fedatt(config: gum.GumConfig, **kwargs) -> PersonalizedProcess:
    """FedAtt (layer-wise attentive aggregation) on the public components; private components stay local."""
    return build_baseline('fedatt', config, **kwargs)
