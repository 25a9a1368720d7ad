"""FedDVA's networks (Yan et al., "Personalization Disentanglement for Federated Learning"): the sizes of the dual
variational autoencoder, its four Keras parts, and the baselines' CNN classifier.

* z-encoder `q(z|x)`: conv layers (kernel 4, stride 2, batch norm, LeakyReLU), then dense heads for mu_z and
  log-variance.
* c-encoder `q(c|x, z)`: a 1x1 conv embedding of x concatenated, as a channel, with a dense embedding of
  stop_gradient(z) reshaped to the image size; then the same kind of conv backbone and mu_c / log-variance heads.
* decoder `p(x|z, c)`: dense layers on [z, c], then transposed convs to per-pixel Bernoulli logits.
* classifier head: on [mu_z, mu_c], standardized by a batch norm without scale/offset (linear or one hidden layer).

Initial weights are seeded: every builder takes a keyword-only ``seed`` (default 0), and the k-th random
initializer (conv/dense kernels; biases and batch norms start at constants) gets the op-level seed
``initializer_seed(seed, k)``, with a fixed index per variable (`_INIT_SEEDS`). Keras draws seeded values with
stateless ops, so a model built twice with one seed has bit-identical weights.

The model that combines the parts, its variable groups and losses: `fedpersonal.models.feddva_models`.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from fedpersonal import errors


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
