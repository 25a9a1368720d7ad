"""User-level DP aggregation of the global update: TFF's DP aggregators, with a fixed clip also per logical client.

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
(`fedpersonal.privacy.dp.DifferentialPrivacy.simulation`).

The accounting of these aggregators: `fedpersonal.privacy.accounting`; a run's DP: `fedpersonal.privacy.dp`.
"""

from __future__ import annotations

import collections

import dp_accounting
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from fedpersonal import errors


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
