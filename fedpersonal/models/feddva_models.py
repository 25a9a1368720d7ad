"""FedDVA's dual variational autoencoder (Yan et al., "Personalization Disentanglement for Federated Learning").

* z-encoder `q(z|x)`: conv layers (kernel 4, stride 2, batch norm, LeakyReLU), then dense heads for mu_z and
  log-variance; prior N(0, I).
* c-encoder `q(c|x, z)`: a 1x1 conv embedding of x concatenated, as a channel, with a dense embedding of
  stop_gradient(z) reshaped to the image size; then the same kind of conv backbone and mu_c / log-variance heads.
* decoder `p(x|z, c)`: dense layers on [z, c], then transposed convs to per-pixel Bernoulli logits.
* classifier head: on [mu_z, mu_c], standardized by a batch norm without scale/offset (linear or one hidden
  layer). By default the head sees stop_gradient([mu_z, mu_c]) (a head on frozen representations); with
  ``head_tunes_encoders`` the head phase also steps both encoders through the cross-entropy, as the paper's
  classification experiments do ("we tune the dual encoders along with a classification head").

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

* Initial weights: the k-th random initializer (conv/dense kernels; biases and batch norms start at constants) gets
  the op-level seed ``initializer_seed(seed, k)`` = ``(seed * 1024 + k) mod 2**31`` (the formula of
  `fedpersonal.models.partially_local_model.initializer_seed`), with a fixed index per variable (`_INIT_SEEDS`).
  Keras draws seeded values with stateless ops, so a `DualVae` built twice with one seed has bit-identical weights
  (FedDVA's clients build it inside their computation: the same seed gives the same initial private state, and
  two runs start identically).
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

PHASES = ('decoder', 'z', 'c', 'head')


@dataclasses.dataclass(frozen=True)
class DvaArchitecture:
    """Sizes of the dual VAE.

    Attributes:
      image_shape: `(h, w, channels)`; h and w divisible by 4.
      z_dim: Dimension of the shared representation z.
      c_dim: Dimension of the personalized representation c.
      encoder_channels: Channels of the stride-2 conv layers of each encoder backbone.
      kernel_size: Conv kernel size.
      embedding_channels: Channels of the c-encoder's 1x1 conv embedding of x.
      decoder_dense: Hidden dense units of the decoder before the spatial projection.
      decoder_channels: Channels of the decoder's transposed convs (two stride-2 upsamplings from h/4).
      head_hidden: Hidden units of the classifier head (0: linear head).
      num_classes: Classes of the head.
      batch_norm_momentum: Momentum of the batch-norm moving statistics.
    """

    image_shape: tuple[int, int, int] = (28, 28, 1)
    z_dim: int = 8
    c_dim: int = 8
    encoder_channels: tuple[int, ...] = (64, 128, 256, 512)
    kernel_size: int = 4
    embedding_channels: int = 1
    decoder_dense: tuple[int, ...] = (512,)
    decoder_channels: tuple[int, ...] = (128, 64)
    head_hidden: int = 0
    num_classes: int = 10
    batch_norm_momentum: float = 0.9

    def __post_init__(self):
        h, w, _ = self.image_shape
        if h % 4 or w % 4:
            raise errors.ConfigError(f'image height and width must be divisible by 4, got {self.image_shape}')
        if self.z_dim < 1 or self.c_dim < 1 or not self.encoder_channels or len(self.decoder_channels) != 2:
            raise errors.ConfigError(
                f'z_dim and c_dim must be >= 1, encoder_channels non-empty and decoder_channels two entries; got {self}'
            )


PAPER = DvaArchitecture()
"""The authors' sizes: 64/128/256/512-channel encoders (kernel 4), latent dims 8 (classification)."""

SCALED = DvaArchitecture(encoder_channels=(8, 16, 32), decoder_dense=(64,), decoder_channels=(16, 8))
"""A CPU-sized variant: 3 conv layers of 8/16/32 channels per encoder, a 64-unit decoder layer, 16/8-channel
transposed convs (the paper: 4 layers of 64..512 channels)."""

# Index of each random initializer in `initializer_seed(seed, index)`; layers numbered i use base + i (i < 10).
_INIT_SEEDS = dict(
    z_conv=10,
    z_mu=30,
    z_logvar=31,
    c_x_embedding=40,
    c_z_embedding=41,
    c_conv=50,
    c_mu=70,
    c_logvar=71,
    dec_dense=80,
    dec_project=100,
    dec_deconv=110,
    dec_out=120,
    head_hidden=130,
    head_logits=131,
)


def initializer_seed(seed: int, index: int) -> int:
    """``(seed * 1024 + index) mod 2**31``: the op-level seed of a model's `index`-th initializer (the formula of
    `fedpersonal.models.partially_local_model.initializer_seed`, repeated here to keep this module dependency-free)."""
    return (int(seed) * 1024 + int(index)) % 2**31


def _glorot(seed: int, name: str, offset: int = 0) -> tf.keras.initializers.Initializer:
    """A fresh, seeded Glorot-uniform initializer (Keras' default kernel initializer) for variable `name`."""
    return tf.keras.initializers.GlorotUniform(seed=initializer_seed(seed, _INIT_SEEDS[name] + offset))


def _backbone(arch: DvaArchitecture, name: str, seed: int) -> list[tf.keras.layers.Layer]:
    layers = []
    for i, channels in enumerate(arch.encoder_channels):
        layers += [
            tf.keras.layers.Conv2D(
                channels,
                arch.kernel_size,
                strides=2,
                padding='same',
                use_bias=False,
                kernel_initializer=_glorot(seed, f'{name}_conv', i),
                name=f'{name}_conv{i}',
            ),
            tf.keras.layers.BatchNormalization(momentum=arch.batch_norm_momentum, name=f'{name}_bn{i}'),
            tf.keras.layers.LeakyReLU(0.2),
        ]
    return layers + [tf.keras.layers.Flatten()]


def _gaussian_heads(features, dim: int, name: str, seed: int):
    mu = tf.keras.layers.Dense(dim, kernel_initializer=_glorot(seed, f'{name}_mu'), name=f'{name}_mu')(features)
    logvar = tf.keras.layers.Dense(dim, kernel_initializer=_glorot(seed, f'{name}_logvar'), name=f'{name}_logvar')(
        features
    )
    return mu, logvar


def build_z_encoder(arch: DvaArchitecture, *, seed: int = 0) -> tf.keras.Model:
    """x -> (mu_z, logvar_z). `seed` (default 0) determines the initial weights (see the module docstring)."""
    x = tf.keras.Input(arch.image_shape)
    h = x
    for layer in _backbone(arch, 'z', seed):
        h = layer(h)
    return tf.keras.Model(x, _gaussian_heads(h, arch.z_dim, 'z', seed), name='z_encoder')


def build_c_encoder(arch: DvaArchitecture, *, seed: int = 0) -> tf.keras.Model:
    """(x, z) -> (mu_c, logvar_c). The caller passes stop_gradient(z). `seed`: as for `build_z_encoder`."""
    height, width, _ = arch.image_shape
    x = tf.keras.Input(arch.image_shape)
    z = tf.keras.Input([arch.z_dim])
    x_embedding = tf.keras.layers.Conv2D(
        arch.embedding_channels, 1, kernel_initializer=_glorot(seed, 'c_x_embedding'), name='c_x_embedding'
    )(x)
    z_embedding = tf.keras.layers.Reshape([height, width, 1])(
        tf.keras.layers.Dense(height * width, kernel_initializer=_glorot(seed, 'c_z_embedding'), name='c_z_embedding')(
            z
        )
    )
    h = tf.keras.layers.Concatenate(axis=-1)([x_embedding, z_embedding])
    for layer in _backbone(arch, 'c', seed):
        h = layer(h)
    return tf.keras.Model([x, z], _gaussian_heads(h, arch.c_dim, 'c', seed), name='c_encoder')


def build_decoder(arch: DvaArchitecture, *, seed: int = 0) -> tf.keras.Model:
    """[z, c] -> per-pixel logits `[n, h, w, channels]`. `seed`: as for `build_z_encoder`."""
    height, width, channels = arch.image_shape
    latent = tf.keras.Input([arch.z_dim + arch.c_dim])
    h = latent
    for i, units in enumerate(arch.decoder_dense):
        h = tf.keras.layers.LeakyReLU(0.2)(
            tf.keras.layers.Dense(units, kernel_initializer=_glorot(seed, 'dec_dense', i), name=f'dec_dense{i}')(h)
        )
    first = arch.decoder_channels[0]
    h = tf.keras.layers.Dense(
        (height // 4) * (width // 4) * first, kernel_initializer=_glorot(seed, 'dec_project'), name='dec_project'
    )(h)
    h = tf.keras.layers.Reshape([height // 4, width // 4, first])(h)
    for i, ch in enumerate(arch.decoder_channels):
        h = tf.keras.layers.Conv2DTranspose(
            ch,
            arch.kernel_size,
            strides=2,
            padding='same',
            use_bias=False,
            kernel_initializer=_glorot(seed, 'dec_deconv', i),
            name=f'dec_deconv{i}',
        )(h)
        h = tf.keras.layers.BatchNormalization(momentum=arch.batch_norm_momentum, name=f'dec_bn{i}')(h)
        h = tf.keras.layers.LeakyReLU(0.2)(h)
    logits = tf.keras.layers.Conv2D(
        channels, 3, padding='same', kernel_initializer=_glorot(seed, 'dec_out'), name='dec_out'
    )(h)
    return tf.keras.Model(latent, logits, name='decoder')


def build_head(arch: DvaArchitecture, *, seed: int = 0) -> tf.keras.Model:
    """[mu_z, mu_c] -> class logits. `seed`: as for `build_z_encoder`."""
    features = tf.keras.Input([arch.z_dim + arch.c_dim])
    # Standardizes the representation per client (moving statistics are private), like a linear probe's scaler:
    # the c regularizers push mu_c far from the origin (KL >= xi), so the raw scales differ a lot.
    h = tf.keras.layers.BatchNormalization(
        center=False, scale=False, momentum=arch.batch_norm_momentum, name='head_standardize'
    )(features)
    if arch.head_hidden:
        h = tf.keras.layers.Dense(
            arch.head_hidden, activation='relu', kernel_initializer=_glorot(seed, 'head_hidden'), name='head_hidden'
        )(h)
    logits = tf.keras.layers.Dense(
        arch.num_classes, kernel_initializer=_glorot(seed, 'head_logits'), name='head_logits'
    )(h)
    return tf.keras.Model(features, logits, name='head')


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


def build_cnn_classifier(
    image_shape: tuple[int, int, int] = (28, 28, 1),
    channels: tuple[int, ...] = (32, 64, 128, 256),
    dense_units: int = 128,
    num_classes: int = 10,
    *,
    seed: int = 0,
) -> tf.keras.Model:
    """The baselines' classifier (FedAvg, FedAvg + fine-tuning, Ditto): stride-2 conv layers (kernel 3, ReLU;
    the FedDVA appendix uses 4) and a 2-layer dense head, no batch norm (all weights federated). Returns logits.

    `seed` (default 0): conv kernel i gets ``initializer_seed(seed, i)``, the dense kernels indices 50 and 51
    (biases start at zero), so every model built with one seed has bit-identical initial weights."""
    init = lambda i: tf.keras.initializers.GlorotUniform(seed=initializer_seed(seed, i))
    x = tf.keras.Input(image_shape)
    h = x
    for i, ch in enumerate(channels):
        h = tf.keras.layers.Conv2D(ch, 3, strides=2, padding='same', activation='relu', kernel_initializer=init(i))(h)
    h = tf.keras.layers.Flatten()(h)
    h = tf.keras.layers.Dense(dense_units, activation='relu', kernel_initializer=init(50))(h)
    return tf.keras.Model(x, tf.keras.layers.Dense(num_classes, kernel_initializer=init(51))(h), name='cnn')
