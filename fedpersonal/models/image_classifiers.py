"""Image classifiers of the personalization benchmarks, as Keras models with named layers.

`fedavg_cnn` is PFLlib's 4-layer CNN (``FedAvgCNN`` in its `system/flcore/trainmodel/models.py`, from McMahan et
al.'s FedAvg paper): two 5x5 convolutions (32 and 64 channels, no padding) each followed by ReLU and 2x2 max-pooling,
a 512-unit ReLU layer and the classifier. Its layers are named ``conv1``, ``conv2``, ``fc1`` (the body) and ``fc``
(the head), the split PFLlib's FedPer, FedRep, FedBABU and LG-FedAvg use. Weights start as PyTorch initializes them
(uniform in +-1/sqrt(fan_in) for kernels and biases), seeded.
"""

from __future__ import annotations

import tensorflow as tf

BODY = ('conv1', 'conv2', 'fc1')
HEAD = ('fc',)


def _torch_default(fan_in: int, seed: int) -> tf.keras.initializers.Initializer:
    limit = 1.0 / fan_in**0.5
    return tf.keras.initializers.RandomUniform(-limit, limit, seed=seed)


def fedavg_cnn(input_shape: tuple[int, int, int] = (28, 28, 1), num_classes: int = 10, seed: int = 0) -> tf.keras.Model:
    """PFLlib's FedAvgCNN: ``conv1 -> pool -> conv2 -> pool -> fc1 -> fc`` (logits).

    Args:
      input_shape: ``(height, width, channels)`` of the images.
      num_classes: Classifier outputs.
      seed: Seeds every initializer (same seed, same weights).

    Returns:
      An uncompiled Keras model with layers named as `BODY` and `HEAD`.

    >>> model = fedavg_cnn()
    >>> model.count_params(), [layer.name for layer in model.layers if layer.weights]
    (582026, ['conv1', 'conv2', 'fc1', 'fc'])
    """
    height, width, channels = input_shape

    def conv(filters: int, fan_in: int, name: str, index: int) -> tf.keras.layers.Conv2D:
        init = lambda offset: _torch_default(fan_in, seed * 16 + 2 * index + offset)
        return tf.keras.layers.Conv2D(
            filters, 5, activation='relu', kernel_initializer=init(0), bias_initializer=init(1), name=name
        )

    def dense(units: int, fan_in: int, name: str, index: int, activation: str | None) -> tf.keras.layers.Dense:
        init = lambda offset: _torch_default(fan_in, seed * 16 + 2 * index + offset)
        return tf.keras.layers.Dense(
            units, activation=activation, kernel_initializer=init(0), bias_initializer=init(1), name=name
        )

    flat = ((height - 4) // 2 - 4) // 2 * (((width - 4) // 2 - 4) // 2) * 64
    return tf.keras.Sequential(
        [
            tf.keras.Input(input_shape),
            conv(32, channels * 25, 'conv1', 0),
            tf.keras.layers.MaxPool2D(2),
            conv(64, 32 * 25, 'conv2', 1),
            tf.keras.layers.MaxPool2D(2),
            tf.keras.layers.Flatten(),
            dense(512, flat, 'fc1', 2, 'relu'),
            dense(num_classes, 512, 'fc', 3, None),
        ],
        name='fedavg_cnn',
    )


def small_cnn(input_shape: tuple[int, int, int] = (8, 8, 1), num_classes: int = 10, seed: int = 0) -> tf.keras.Model:
    """A small CNN for images of any size (``--model=fedpersonal.models.image_classifiers:small_cnn``): two 3x3
    ``same``-padded convolutions (16 and 32 channels, ReLU), flattened, a 64-unit ReLU layer and the classifier
    ``fc`` (the head; ``H * W * 2048`` weights in ``fc1``). For images PFLlib's CNN cannot take (under 16 x 16, e.g. scikit-learn's 8 x 8
    digits).

    >>> model = small_cnn((8, 8, 3), 4)
    >>> model.output_shape, [layer.name for layer in model.layers if layer.weights][-1]
    ((None, 4), 'fc')
    """
    init = lambda offset: tf.keras.initializers.GlorotUniform(seed=seed * 16 + offset)
    return tf.keras.Sequential(
        [
            tf.keras.Input(input_shape),
            tf.keras.layers.Conv2D(16, 3, padding='same', activation='relu', kernel_initializer=init(0), name='conv1'),
            tf.keras.layers.Conv2D(32, 3, padding='same', activation='relu', kernel_initializer=init(1), name='conv2'),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation='relu', kernel_initializer=init(2), name='fc1'),
            tf.keras.layers.Dense(num_classes, kernel_initializer=init(3), name='fc'),
        ],
        name='small_cnn',
    )


def fits_fedavg_cnn(input_shape: tuple[int, ...]) -> bool:
    """Whether `fedavg_cnn` takes images of `input_shape` (``(height, width, channels)``): at least 16 x 16."""
    return min(input_shape[:2]) >= 16
