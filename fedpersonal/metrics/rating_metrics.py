"""Rating-prediction metrics (RMSE, MAE, rating accuracy) and per-client summaries."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping

import numpy as np
import tensorflow as tf


def _within_threshold(threshold: float) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    def fn(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.abs(tf.cast(y_true, y_pred.dtype) - y_pred) <= threshold, tf.float32)

    return fn


class RatingAccuracy(tf.keras.metrics.MeanMetricWrapper):
    """Fraction of predictions within `threshold` of the true rating.

    With the default 0.5 this is the FedRecon paper code's definition: the
    prediction rounds to the true (integer) rating.
    """

    def __init__(self, threshold: float = 0.5, name: str = 'accuracy', dtype=None):
        super().__init__(_within_threshold(threshold), name=name, dtype=dtype)
        self.threshold = threshold

    def get_config(self):
        return {'threshold': self.threshold, 'name': self.name, 'dtype': self.dtype}


def rating_metrics_fn(accuracy_threshold: float = 0.5) -> Callable[[], list[tf.keras.metrics.Metric]]:
    """A no-arg `metrics_fn` with RMSE, MAE and rating accuracy."""

    def metrics_fn() -> list[tf.keras.metrics.Metric]:
        return [
            tf.keras.metrics.RootMeanSquaredError(name='rmse'),
            tf.keras.metrics.MeanAbsoluteError(name='mae'),
            RatingAccuracy(accuracy_threshold, name='accuracy'),
        ]

    return metrics_fn


QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def summarize_per_client(per_client: Mapping[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Distribution of each per-client metric: mean, std, min, quantiles, max, count.

    A client without evaluation examples (its ``num_examples`` is 0, e.g. a one-rating user whose only rating went
    to the support set) has no value of any metric: Keras reports 0 for it (an RMSE of 0.0), so it is left out of
    every distribution and counted in ``clients_without_examples``.

    >>> summary = summarize_per_client({'rmse': [1.0, 0.0, 3.0], 'num_examples': [4, 0, 2]})
    >>> summary['rmse']['p50'], summary['rmse']['clients'], summary['rmse']['clients_without_examples']
    (2.0, 2, 1)

    Args:
      per_client: metric name -> one value per client (NaNs are ignored too); with ``num_examples``, clients
        without examples are left out.

    Returns:
      metric name -> {'mean', 'std', 'min', 'p10', 'p25', 'p50', 'p75', 'p90', 'max', 'clients',
      'clients_without_examples'}.
    """
    counts = per_client.get('num_examples')
    has_examples = None if counts is None else np.asarray(counts, dtype=np.float64).ravel() > 0
    without = 0 if has_examples is None else int(np.sum(~has_examples))
    summary: dict[str, dict[str, float]] = {}
    for name, values in per_client.items():
        values = np.asarray(values, dtype=np.float64).ravel()
        if has_examples is not None and name != 'num_examples' and values.shape == has_examples.shape:
            values = values[has_examples]
        values = values[np.isfinite(values)]
        if values.size == 0:
            summary[name] = {'clients': 0, 'clients_without_examples': without}
            continue
        row: dict[str, float] = {'mean': float(values.mean()), 'std': float(values.std()), 'min': float(values.min())}
        for q, v in zip(QUANTILES, np.quantile(values, QUANTILES)):
            row[f'p{int(q * 100)}'] = float(v)
        row['max'] = float(values.max())
        row['clients'] = int(values.size)
        row['clients_without_examples'] = without
        summary[name] = row
    return summary
