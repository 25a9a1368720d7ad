"""Metrics and per-client metric distributions."""

from fedpersonal.metrics.rating_metrics import RatingAccuracy
from fedpersonal.metrics.rating_metrics import rating_metrics_fn
from fedpersonal.metrics.rating_metrics import summarize_per_client
