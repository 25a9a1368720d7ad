"""FedDVA's dual variational autoencoder (Yan et al., "Personalization Disentanglement for Federated Learning").

`DualVae` combines the four Keras parts of `fedpersonal.models.feddva_networks` (z-encoder `q(z|x)` with prior
N(0, I), c-encoder `q(c|x, z)`, decoder `p(x|z, c)`, classifier head on [mu_z, mu_c]). By default the head sees
stop_gradient([mu_z, mu_c]) (a head on frozen representations); with ``head_tunes_encoders`` the head phase also
steps both encoders through the cross-entropy, as the paper's classification experiments do ("we tune the dual
encoders along with a classification head").

Variable groups (`DualVae`): the *federated* parameters are both encoders' trainable variables (including the
embeddings); the *private* ones are the decoder's and the head's trainable variables plus every batch-norm
statistic (moving mean/variance, encoders' included).

Losses (per example, averaged over the batch): reconstruction = Bernoulli negative log-likelihood summed over
pixels; Gaussian KL terms in closed form (`kl_standard_normal`, `kl_to_unit_gaussian_at`, `mean_pairwise_kl`).
The three phases of a client round (`phase_loss`):

1. 'decoder': reconstruction with z ~ q(z|x) and c from N(0, I) (the authors' code) or from q(c|x, z) (the
   paper's Eq. 9: the full loss), encoders fixed.
2. 'z': reconstruction + KL(q(z|x) || N(0, I)); only the z branch steps.
3. 'c': reconstruction + lambda_c * KL(q(c|x) || N(stop_gradient(mean_batch mu_c), I))
   + lambda_cc * relu(xi + L_reg - KL(q(c|x) || N(0, I))), with L_reg the mean KL from q(c|x_i) to the other
   in-batch posteriors q(c|x_j), j != i (the slack regularizer and Inequality 5); only the c branch steps.

Plus an optional 'head' phase: softmax cross-entropy of the head on the posterior means (fixed, or tuned with the
head: ``head_tunes_encoders``).

Seeding (reproducibility): every builder takes a keyword-only ``seed`` (default 0).

* Initial weights: seeded initializers (`fedpersonal.models.feddva_networks`), so a `DualVae` built twice with one
  seed has bit-identical weights (FedDVA's clients build it inside their computation: the same seed gives the same
  initial private state, and two runs start identically).
* Reparameterization noise (`DualVae.noise`, used by `phase_loss`): stateless N(0, I) draws whose seed is a
  function of the model's seed, the phase, the batch's pixel values, the step's index in the phase and the
  client's participation count (`DualVae.participations`, a private non-trainable counter that FedDVA's client
  round increments). The noise is therefore deterministic, yet differs between clients (their batches differ),
  between steps and between rounds (the counter grows). It is not a function of any trained value: two ways of
  computing the same training (one client at a time, or many in lockstep, `fedpersonal.simulation`) differ in
  float rounding, and noise seeded by the bits of trained weights would then differ completely.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from fedpersonal import errors
from fedpersonal.models.feddva_networks import PAPER as PAPER
from fedpersonal.models.feddva_networks import SCALED as SCALED
from fedpersonal.models.feddva_networks import DvaArchitecture as DvaArchitecture
from fedpersonal.models.feddva_networks import build_c_encoder as build_c_encoder
from fedpersonal.models.feddva_networks import build_cnn_classifier as build_cnn_classifier
from fedpersonal.models.feddva_networks import build_decoder as build_decoder
from fedpersonal.models.feddva_networks import build_head as build_head
from fedpersonal.models.feddva_networks import build_z_encoder as build_z_encoder
from fedpersonal.models.feddva_networks import initializer_seed as initializer_seed

PHASES = ('decoder', 'z', 'c', 'head')


# ------------------------------------------------------------------ losses
def kl_standard_normal(mu: tf.Tensor, logvar: tf.Tensor) -> tf.Tensor:
    """KL(N(mu, diag(exp(logvar))) || N(0, I)) per example (summed over the last axis)."""
    return 0.5 * tf.reduce_sum(tf.exp(logvar) + tf.square(mu) - 1.0 - logvar, axis=-1)


def kl_to_unit_gaussian_at(mu: tf.Tensor, logvar: tf.Tensor, centre: tf.Tensor) -> tf.Tensor:
    """KL(N(mu, diag(exp(logvar))) || N(centre, I)) per example."""
    return 0.5 * tf.reduce_sum(tf.exp(logvar) + tf.square(mu - centre) - 1.0 - logvar, axis=-1)


def pairwise_kl(mu: tf.Tensor, logvar: tf.Tensor) -> tf.Tensor:
    """`[n, n]` matrix of KL(q_i || q_j) between diagonal Gaussians (zero diagonal)."""
    var = tf.exp(logvar)
    mu_i, mu_j = mu[:, None, :], mu[None, :, :]
    lv_i, lv_j = logvar[:, None, :], logvar[None, :, :]
    return 0.5 * tf.reduce_sum(lv_j - lv_i + (var[:, None, :] + tf.square(mu_i - mu_j)) / tf.exp(lv_j) - 1.0, axis=-1)


def mean_pairwise_kl(mu: tf.Tensor, logvar: tf.Tensor) -> tf.Tensor:
    """L_reg per example: mean over j != i of KL(q_i || q_j) (0 for a batch of one)."""
    n = tf.cast(tf.shape(mu)[0], mu.dtype)
    return tf.reduce_sum(pairwise_kl(mu, logvar), axis=1) / tf.maximum(n - 1.0, 1.0)


def c_regularizer(mu_c: tf.Tensor, logvar_c: tf.Tensor, *, lambda_c: float, lambda_cc: float, xi: float) -> tf.Tensor:
    """Per-example regularizer of the c phase:
    lambda_c * KL(q_c || N(sg(mean mu_c), I)) + lambda_cc * relu(xi + L_reg - KL(q_c || N(0, I)))."""
    centre = tf.stop_gradient(tf.reduce_mean(mu_c, axis=0, keepdims=True))
    slack = kl_to_unit_gaussian_at(mu_c, logvar_c, centre)
    constraint = tf.nn.relu(xi + mean_pairwise_kl(mu_c, logvar_c) - kl_standard_normal(mu_c, logvar_c))
    return lambda_c * slack + lambda_cc * constraint


def reconstruction_loss(x: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Bernoulli negative log-likelihood per example, summed over pixels (x in [0, 1])."""
    per_pixel = tf.nn.sigmoid_cross_entropy_with_logits(labels=x, logits=logits)
    return tf.reduce_sum(tf.reshape(per_pixel, [tf.shape(x)[0], -1]), axis=1)


def sample(mu: tf.Tensor, logvar: tf.Tensor, eps: tf.Tensor) -> tf.Tensor:
    """Reparameterized sample mu + exp(logvar / 2) * eps."""
    return mu + tf.exp(0.5 * logvar) * eps


@dataclasses.dataclass(frozen=True)
class LossWeights:
    """Weights of the c phase (the paper: lambda_c = 1, lambda_cc = 0.75, xi = 8 * c_dim).

    Attributes:
      lambda_c: Weight of the slack regularizer KL(q(c|x) || N(sg(batch mean of mu_c), I)).
      lambda_cc: Weight of the hinge on Inequality 5.
      xi: The constraint threshold (None: 8 * c_dim).
      decoder_c_source: 'prior' (c ~ N(0, I) in the decoder phase, the authors' code) or 'posterior'
        (c ~ q(c|x, z), the gradient of the full loss as in the paper's Eq. 9).
    """

    lambda_c: float = 1.0
    lambda_cc: float = 0.75
    xi: float | None = None
    decoder_c_source: str = 'posterior'

    def __post_init__(self):
        if self.decoder_c_source not in ('prior', 'posterior'):
            raise errors.ConfigError(f"decoder_c_source must be 'prior' or 'posterior', got {self.decoder_c_source!r}")


class DualVae:
    """The four Keras parts of FedDVA and their variable groups.

    Args:
      arch: Sizes.
      weights: Loss weights of the phases.
      head_tunes_encoders: The 'head' phase also steps both encoders (the federated variables) through the
        classification loss (encoder batch norms in inference mode); otherwise only the head steps, on
        stop_gradient of the posterior means.
      seed: Determines the initial weights (bit-identical for every `DualVae` built with the same seed and
        architecture, e.g. the initial private state of every FedDVA client) and, with the data, the step and the
        participation count, the reparameterization noise (`noise`). Default 0.

    Attributes:
      participations: int64 counter of the client rounds this model took part in (private, non-trainable).
    """

    def __init__(
        self,
        arch: DvaArchitecture = SCALED,
        weights: LossWeights = LossWeights(),
        head_tunes_encoders: bool = False,
        *,
        seed: int = 0,
    ):
        self.arch = arch
        self.weights = weights
        self.head_tunes_encoders = bool(head_tunes_encoders)
        self.seed = int(seed)
        self.xi = float(weights.xi if weights.xi is not None else 8.0 * arch.c_dim)
        self.z_encoder = build_z_encoder(arch, seed=seed)
        self.c_encoder = build_c_encoder(arch, seed=seed)
        self.decoder = build_decoder(arch, seed=seed)
        self.head = build_head(arch, seed=seed)
        self.participations = tf.Variable(0, dtype=tf.int64, trainable=False, name='participations')

    # Variable groups.
    @property
    def z_branch(self) -> list[tf.Variable]:
        return list(self.z_encoder.trainable_variables)

    @property
    def c_branch(self) -> list[tf.Variable]:
        return list(self.c_encoder.trainable_variables)

    @property
    def decoder_variables(self) -> list[tf.Variable]:
        return list(self.decoder.trainable_variables)

    @property
    def head_variables(self) -> list[tf.Variable]:
        return list(self.head.trainable_variables)

    @property
    def global_trainable(self) -> list[tf.Variable]:
        """Federated parameters: both encoders (with their embeddings)."""
        return self.z_branch + self.c_branch

    @property
    def private_trainable(self) -> list[tf.Variable]:
        """Client-local trainable parameters: decoder and classifier head."""
        return self.decoder_variables + self.head_variables

    @property
    def private_non_trainable(self) -> list[tf.Variable]:
        """Client-local batch-norm statistics of all parts, then the participation counter."""
        return (
            list(self.z_encoder.non_trainable_variables)
            + list(self.c_encoder.non_trainable_variables)
            + list(self.decoder.non_trainable_variables)
            + list(self.head.non_trainable_variables)
            + [self.participations]
        )

    # The groups of a partially local model (FedDVA's client plan: `fedpersonal.core.model_loss_plan.PhasedModel`).
    @property
    def global_trainable_variables(self) -> list[tf.Variable]:
        return self.global_trainable

    @property
    def global_non_trainable_variables(self) -> list[tf.Variable]:
        return []

    @property
    def local_trainable_variables(self) -> list[tf.Variable]:
        return self.private_trainable

    @property
    def local_non_trainable_variables(self) -> list[tf.Variable]:
        return self.private_non_trainable

    def variables_of(self, phase: str) -> list[tf.Variable]:
        """The trainable variables stepped in `phase`."""
        if phase not in PHASES:
            raise ValueError(f'unknown phase {phase!r}; expected one of {PHASES}')
        head = self.head_variables + (self.global_trainable if self.head_tunes_encoders else [])
        return {'decoder': self.decoder_variables, 'z': self.z_branch, 'c': self.c_branch, 'head': head}[phase]

    def phase_statistic(self, statistic: str, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        """``'accuracy'``: the number of examples of the batch the head classifies correctly."""
        if statistic != 'accuracy':
            raise ValueError(f"unknown statistic {statistic!r}; expected 'accuracy'")
        predicted = tf.argmax(self.classify(x), axis=-1, output_type=tf.int32)
        return tf.reduce_sum(tf.cast(tf.equal(predicted, tf.cast(y, tf.int32)), tf.float32))

    # Forward passes.
    def encode(self, x: tf.Tensor, training: bool = False):
        """(mu_z, logvar_z, mu_c, logvar_c); c is conditioned on mu_z at inference."""
        mu_z, logvar_z = self.z_encoder(x, training=training)
        mu_c, logvar_c = self.c_encoder([x, tf.stop_gradient(mu_z)], training=training)
        return mu_z, logvar_z, mu_c, logvar_c

    def decode(self, z: tf.Tensor, c: tf.Tensor, training: bool = False) -> tf.Tensor:
        """Pixel logits."""
        return self.decoder(tf.concat([z, c], axis=-1), training=training)

    def features(self, x: tf.Tensor, stop_gradient: bool = True) -> tf.Tensor:
        """[mu_z, mu_c] at inference (the head's input), by default under stop_gradient."""
        mu_z, _, mu_c, _ = self.encode(x, training=False)
        features = tf.concat([mu_z, mu_c], axis=-1)
        return tf.stop_gradient(features) if stop_gradient else features

    def classify(self, x: tf.Tensor) -> tf.Tensor:
        """Class logits of the head on [mu_z, mu_c]."""
        return self.head(self.features(x), training=False)

    def phase_terms(
        self, phase: str, x: tf.Tensor, eps_z: tf.Tensor, eps_c: tf.Tensor, y: tf.Tensor | None = None
    ) -> dict[str, tf.Tensor]:
        """Batch-mean loss terms of one phase with explicit reparameterization noise (training mode).

        Returns a dict with 'loss' (what the phase minimizes) and its terms ('reconstruction', 'kl_z',
        'kl_c_slack', 'constraint', 'cross_entropy' as applicable).
        """
        if phase == 'head':
            logits = self.head(self.features(x, stop_gradient=not self.head_tunes_encoders), training=True)
            ce = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(y, tf.int32), logits=logits)
            )
            return {'loss': ce, 'cross_entropy': ce}
        mu_z, logvar_z = self.z_encoder(x, training=True)
        z = sample(mu_z, logvar_z, eps_z)
        if phase != 'z':
            z = tf.stop_gradient(z)
        mu_c, logvar_c = self.c_encoder([x, tf.stop_gradient(z)], training=True)
        if phase == 'decoder' and self.weights.decoder_c_source == 'prior':
            c = eps_c
        else:
            c = sample(mu_c, logvar_c, eps_c)
        if phase != 'c':
            c = tf.stop_gradient(c)
        recon = tf.reduce_mean(reconstruction_loss(x, self.decode(z, c, training=True)))
        if phase == 'decoder':
            return {'loss': recon, 'reconstruction': recon}
        if phase == 'z':
            kl_z = tf.reduce_mean(kl_standard_normal(mu_z, logvar_z))
            return {'loss': recon + kl_z, 'reconstruction': recon, 'kl_z': kl_z}
        if phase == 'c':
            centre = tf.stop_gradient(tf.reduce_mean(mu_c, axis=0, keepdims=True))
            slack = tf.reduce_mean(kl_to_unit_gaussian_at(mu_c, logvar_c, centre))
            constraint = tf.reduce_mean(
                tf.nn.relu(self.xi + mean_pairwise_kl(mu_c, logvar_c) - kl_standard_normal(mu_c, logvar_c))
            )
            loss = recon + self.weights.lambda_c * slack + self.weights.lambda_cc * constraint
            return {'loss': loss, 'reconstruction': recon, 'kl_c_slack': slack, 'constraint': constraint}
        raise ValueError(f'unknown phase {phase!r}; expected one of {PHASES}')

    def noise(self, phase: str, x: tf.Tensor, step: tf.Tensor | int = 0) -> tuple[tf.Tensor, tf.Tensor]:
        """`reparameterization_noise` of step `step` of `phase` on the batch `x` in the current participation."""
        return reparameterization_noise(self.seed, self.arch, phase, x, self.participations, step)

    def phase_loss(self, phase: str, x: tf.Tensor, y: tf.Tensor | None = None, step: tf.Tensor | int = 0) -> tf.Tensor:
        """The loss of `phase` on a batch (the phase's `step`-th), with N(0, I) reparameterization noise from `noise`
        (fresh for every step, client and round, yet a deterministic function of the seed and the data)."""
        if phase == 'head':  # No sampling in the head phase.
            n = tf.shape(x)[0]
            eps_z, eps_c = tf.zeros([n, self.arch.z_dim]), tf.zeros([n, self.arch.c_dim])
        else:
            eps_z, eps_c = self.noise(phase, x, step)
        return self.phase_terms(phase, x, eps_z, eps_c, y)['loss']


def noise_seed(seed: int, phase: str, x: tf.Tensor, participation: tf.Tensor, step: tf.Tensor | int) -> tf.Tensor:
    """The `[2]` int64 stateless seed of the noise of step `step` of `phase` on the batch `x`: ``[seed, phase index]``
    folded with a fingerprint (farmhash64) of the bits of `x`, the participation count and the step (module doc)."""
    fingerprint = tf.bitcast(tf.fingerprint(tf.reshape(tf.cast(x, tf.float32), [1, -1])), tf.int64)[0]
    fold_in = tf.random.experimental.stateless_fold_in
    folded = fold_in(tf.constant([seed, PHASES.index(phase)], tf.int64), fingerprint)
    return fold_in(fold_in(folded, tf.cast(participation, tf.int64)), tf.cast(step, tf.int64))


def reparameterization_noise(
    seed: int, arch: DvaArchitecture, phase: str, x: tf.Tensor, participation: tf.Tensor, step: tf.Tensor | int
) -> tuple[tf.Tensor, tf.Tensor]:
    """`(eps_z [n, z_dim], eps_c [n, c_dim])`: stateless N(0, I) draws seeded by `noise_seed` (deterministic)."""
    n = tf.shape(x)[0]
    folded = noise_seed(seed, phase, x, participation, step)
    fold_in = tf.random.experimental.stateless_fold_in
    eps_z = tf.random.stateless_normal([n, arch.z_dim], seed=fold_in(folded, tf.constant(0, tf.int64)))
    eps_c = tf.random.stateless_normal([n, arch.c_dim], seed=fold_in(folded, tf.constant(1, tf.int64)))
    return eps_z, eps_c
