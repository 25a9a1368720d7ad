"""FedDVA experiment: one setting's federated data, and its task (datasets, models, evaluations).

Split from `fedpersonal.tasks.feddva` (which trains the methods) so that the training and the analysis
(`fedpersonal.tasks.feddva_analysis`) both build on it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from fedpersonal import errors
from fedpersonal import program
from fedpersonal.data import federated_images
from fedpersonal.models import feddva_models
from fedpersonal.models import feddva_networks
from fedpersonal.tasks.feddva_config import FeddvaConfig

SETTING_NAMES = {'heterogeneous_inputs': 'heterogeneous inputs', 'heterogeneous_outputs': 'heterogeneous outputs'}
EVAL_BATCH = 500  # Images per model call in the evaluations and the analysis's encodings.


def load_setting(config: FeddvaConfig, source, setting: str) -> federated_images.FederatedImageData:
    """The federated data of one setting."""
    inputs = setting == 'heterogeneous_inputs'
    return federated_images.federate(
        source,
        num_clients=config.num_clients,
        train_per_client=config.train_per_client,
        test_per_client=config.test_per_client,
        alpha=config.alpha_inputs if inputs else config.alpha_outputs,
        marks=inputs or config.marks_in_outputs,
        seed=config.seed,
        setting=SETTING_NAMES[setting],
        validation_per_client=config.validation_per_client,
    )


class FeddvaTask:
    """Datasets, models and evaluations of one setting."""

    def __init__(self, config: FeddvaConfig, data: federated_images.FederatedImageData):
        self.config = config
        self.data = data
        self.train = data.client_data('train')
        self.arch = config.dva_architecture(data.image_shape, data.num_classes)
        self.loss_weights = feddva_models.LossWeights(
            config.lambda_c, config.lambda_cc, config.xi, config.decoder_c_source
        )
        self.element_spec = self.dataset_fn(self.train.create_tf_dataset_for_client(data.client_ids[0])).element_spec

    def dataset_fn(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.shuffle(1000, seed=self.config.seed, reshuffle_each_iteration=True).batch(self.config.batch_size)

    def dva_fn(self, head_tunes_encoders: bool = False) -> feddva_models.DualVae:
        return feddva_models.DualVae(
            self.arch, self.loss_weights, head_tunes_encoders=head_tunes_encoders, seed=self.config.seed
        )

    def cnn_fn(self) -> tf.keras.Model:
        cfg = self.config
        return feddva_networks.build_cnn_classifier(
            self.data.image_shape, tuple(cfg.cnn_channels), cfg.cnn_dense, self.data.num_classes, seed=cfg.seed
        )

    def accuracy(self, logits_fn: Callable[[str, np.ndarray], np.ndarray], split: str = 'test') -> dict[str, float]:
        """Example-weighted and client-mean accuracy of `logits_fn(client_id, images)` on every client."""
        return self._accuracies(logits_fn, (split,))[split]

    @property
    def selects_on_validation(self) -> bool:
        """Whether the rows are selected on a validation split (`FeddvaConfig.validation_per_client`)."""
        return bool(self.data.validation)

    def evaluate(self, logits_fn: Callable[[str, np.ndarray], np.ndarray]) -> dict[str, float]:
        """The periodic evaluation: with a validation split, its accuracies (`accuracy`'s keys) plus the test
        split's as ``test_<key>`` (clients visited once, e.g. each fine-tuned once); else the test accuracies."""
        if not self.selects_on_validation:
            return self.accuracy(logits_fn)
        result = self._accuracies(logits_fn, ('validation', 'test'))
        return {**result['validation'], **{f'test_{k}': v for k, v in result['test'].items()}}

    def _accuracies(self, logits_fn, splits) -> dict[str, dict[str, float]]:
        sources = {split: self.data.split(split) for split in splits}
        hits: dict[str, list[int]] = {split: [] for split in splits}  # Per client, in client order.
        sizes: dict[str, list[int]] = {split: [] for split in splits}
        for cid in self.data.client_ids:
            for split in splits:
                images, labels = sources[split][cid]
                logits = np.concatenate(
                    [logits_fn(cid, images[i : i + EVAL_BATCH]) for i in range(0, len(images), EVAL_BATCH)]
                )
                hits[split].append(int(np.sum(np.argmax(logits, axis=-1) == labels)))
                sizes[split].append(int(labels.size))
        result = {}
        for split in splits:
            per_client = [h / max(n, 1) for h, n in zip(hits[split], sizes[split])]
            result[split] = {
                'accuracy': sum(hits[split]) / max(sum(sizes[split]), 1),
                'client_mean_accuracy': float(np.mean(per_client)),
                'client_min_accuracy': float(np.min(per_client)),
            }
        return result

    def stopping(self) -> program.EarlyStopping | None:
        """Early stopping on the validation accuracy (None without a validation split: nothing is selected)."""
        if not self.selects_on_validation:
            return None
        cfg = self.config
        return program.EarlyStopping(
            'accuracy', mode='max', patience=cfg.early_stopping_patience, min_delta=cfg.early_stopping_min_delta
        )

    def selected_row(
        self, outputs: program.ExperimentOutputs, stopping: program.EarlyStopping | None, prefix: str = ''
    ) -> dict[str, Any]:
        """The test accuracies of the evaluation round selected on validation, read from the run's metrics.

        The round is `stopping`'s best (the first evaluation with the highest validation accuracy, up to its
        `min_delta`), or, without `stopping`, the first evaluation with the highest ``eval/<prefix>accuracy``
        (e.g. ``prefix='ft_'``: FedAvg + fine-tuning, evaluated in the FedAvg run). The test images play no part
        in the choice: the row is the selected model's test accuracy (`evaluate` measured it in that round).
        """
        metrics = [r for r in outputs.read_metrics() if 'round' in r]
        evaluations = [r for r in metrics if f'eval/{prefix}accuracy' in r]
        if not evaluations:
            raise errors.ConfigError(f'{outputs.directory}: no evaluation to select from (rounds_per_eval?).')
        if stopping is not None and stopping.best_round:
            best = next(r for r in evaluations if int(r['round']) == stopping.best_round)
        else:
            best = max(evaluations, key=lambda r: (r[f'eval/{prefix}accuracy'], -r['round']))
        row: dict[str, Any] = {
            key: best[f'eval/{prefix}test_{key}'] for key in ('accuracy', 'client_mean_accuracy', 'client_min_accuracy')
        }
        row.update(
            best_round=int(best['round']),
            best_validation_accuracy=best[f'eval/{prefix}accuracy'],
            rounds=int(max(r['round'] for r in metrics)),
            early_stopped=bool(stopping is not None and stopping.stopped),
        )
        return row
