"""HPFL experiment: the pooled (centralized) view of the silos and the centralized rows (NCD, NCF, GUM).

Split from `fedpersonal.tasks.hpfl_user_modeling` (which runs every row) so each module keeps one job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from absl import logging

from fedpersonal import program
from fedpersonal import progress
from fedpersonal.algorithms import hpfl
from fedpersonal.data import user_modeling
from fedpersonal.metrics import user_modeling_metrics as um_metrics
from fedpersonal.models import gum
from fedpersonal.models import user_modeling_baselines as baselines
from fedpersonal.tasks.hpfl_analysis import evaluate_predictions
from fedpersonal.tasks.hpfl_analysis import gum_attribute_proficiency
from fedpersonal.tasks.hpfl_user_modeling_config import HpflConfig


# ------------------------------------------------------------------------------------------------ pooled indices
class PooledIndex:
    """Index spaces of the pooled silos.

    * *stacked*: silo s's local user u is ``user_offset[s] + u`` (items likewise); every (silo, user) and
      (silo, item) is distinct. Metrics are computed here (DOA pairs form within a silo).
    * *global*: the dataset's global user/item ids, numbered ``0..`` in increasing id order (the centralized models'
      tables; an item shared by several silos is one row).
    """

    def __init__(self, data: user_modeling.UserModelingData):
        self.data = data
        silos = data.silos
        self.user_offset = np.concatenate([[0], np.cumsum([s.num_users for s in silos])]).astype(np.int64)
        self.item_offset = np.concatenate([[0], np.cumsum([s.num_items for s in silos])]).astype(np.int64)
        user_ids = np.concatenate([s.global_user_ids for s in silos])
        item_ids = np.concatenate([s.global_item_ids for s in silos])
        self.global_user_ids, self.user_to_global = np.unique(user_ids, return_inverse=True)
        self.global_item_ids, self.item_to_global = np.unique(item_ids, return_inverse=True)
        self.num_global_users = self.global_user_ids.size
        self.num_global_items = self.global_item_ids.size
        self.stacked_item_attributes = np.concatenate([s.item_attributes for s in silos]).astype(np.float32)
        self.global_item_attributes = np.zeros([self.num_global_items, data.num_attributes], np.float32)
        self.global_item_attributes[self.item_to_global] = self.stacked_item_attributes
        self.silo_of_user = np.repeat(np.arange(len(silos)), [s.num_users for s in silos])

    def split(self, name: str) -> dict[str, np.ndarray]:
        """Records of one split in silo order: stacked and global user/item indices, labels (original scale), silo."""
        parts = []
        for s, silo in enumerate(self.data.silos):
            keep = silo.split == hpfl.SPLITS[name]
            parts.append(
                (
                    silo.user[keep] + self.user_offset[s],
                    silo.item[keep] + self.item_offset[s],
                    silo.label[keep],
                    np.full(int(keep.sum()), s),
                )
            )
        user, item, label, silo_index = (np.concatenate(p) for p in zip(*parts))
        return {
            'user': user,
            'item': item,
            'global_user': self.user_to_global[user],
            'global_item': self.item_to_global[item],
            'label': label.astype(np.float32),
            'silo': silo_index,
        }

    def pooled_arrays(self, name: str) -> baselines.PooledArrays:
        """A split with global indices and unit-scale labels, for the centralized models."""
        records = self.split(name)
        return baselines.PooledArrays(
            user=records['global_user'],
            item=records['global_item'],
            attributes=self.global_item_attributes[records['global_item']],
            label=gum.to_unit(records['label'], self.data.rating_range).astype(np.float32),
        )


# ------------------------------------------------------------------------------------------------ centralized
_Model = baselines.NcdModel | baselines.NcfModel | baselines.CentralGumModel


def _ncd(config: HpflConfig, data: user_modeling.UserModelingData, index: PooledIndex) -> _Model:
    return baselines.NcdModel(
        index.num_global_users,
        index.num_global_items,
        data.num_attributes,
        hidden_units=config.ncd_hidden_units,
        seed=config.seed,
    )


def _ncf(config: HpflConfig, data: user_modeling.UserModelingData, index: PooledIndex) -> _Model:
    return baselines.NcfModel(
        index.num_global_users,
        index.num_global_items,
        embedding_dim=config.ncf_embedding_dim,
        task=data.task,
        seed=config.seed,
    )


def _gum(config: HpflConfig, data: user_modeling.UserModelingData, index: PooledIndex) -> _Model:
    gum_config = gum.GumConfig(
        num_attributes=data.num_attributes,
        max_users=index.num_global_users,
        max_items=index.num_global_items,
        hidden_dim=config.hidden_dim,
        task=data.task,
        rating_range=(float(data.rating_range[0]), float(data.rating_range[1])),
    )
    return baselines.CentralGumModel(gum_config, seed=config.seed)


# A centralized method's model: `(config, data, index) -> model`, trained alike by `run_centralized`.
MODELS: dict[str, Callable[[HpflConfig, user_modeling.UserModelingData, PooledIndex], _Model]] = {
    'ncd': _ncd,
    'ncf': _ncf,
    'gum': _gum,
}


def run_centralized(
    method: str,
    config: HpflConfig,
    data: user_modeling.UserModelingData,
    index: PooledIndex,
    outputs: program.ExperimentOutputs,
) -> tuple[dict[str, Any], np.ndarray | None]:
    model = program.runner_for(MODELS, method, 'method')(config, data, index)
    train, validation, test = (index.pooled_arrays(s) for s in ('train', 'validation', 'test'))
    validation_labels = index.split('validation')['label']
    epoch_seconds: list[float] = []

    def on_epoch_end(epoch, row):
        prediction = gum.from_unit(
            baselines.predict_arrays(model, validation, config.eval_batch_size), data.rating_range
        )
        val = evaluate_predictions(data.task, data.rating_range, validation_labels, prediction)
        outputs.release_metrics(
            epoch,
            {
                'train': {'loss': row['train_loss']},
                'validation': {'loss': row['validation_loss'], **val},
                'seconds': row['seconds'],
            },
        )
        epoch_seconds.append(row['seconds'])
        logging.info(
            '[%s] %s  train_loss=%.4f validation_loss=%.4f %s',
            method,
            progress.epoch_text(epoch, config.centralized_epochs, epoch_seconds),
            row['train_loss'],
            row['validation_loss'],
            ' '.join(f'{a}={b:.4f}' for a, b in val.items()),
        )

    result = baselines.train_centralized(
        model,
        train,
        validation,
        epochs=config.centralized_epochs,
        learning_rate=config.centralized_learning_rate,
        batch_size=config.centralized_batch_size,
        seed=config.seed,
        on_epoch_end=on_epoch_end,
    )
    records = index.split('test')
    prediction = gum.from_unit(baselines.predict_arrays(model, test, config.eval_batch_size), data.rating_range)
    scores = model.user_attribute_scores(index.global_item_attributes)
    theta = None
    if isinstance(model, baselines.CentralGumModel):
        theta = scores[index.user_to_global]
        public = gum.PublicWeights(*[v.numpy() for v in model.public])
        scores = gum_attribute_proficiency(public, scores)
    # Stacked rows take their global user's scores: metrics are computed in the stacked index space.
    stacked_scores = scores[index.user_to_global]
    row: dict[str, Any] = evaluate_predictions(
        data.task,
        data.rating_range,
        records['label'],
        prediction,
        user=records['user'],
        item=records['item'],
        user_scores=stacked_scores,
        item_attributes=index.stacked_item_attributes,
        ndcg_k=config.ndcg_k,
        ndcg_gain=config.ndcg_gain,
    )
    if theta is not None:
        row['doa_theta'] = um_metrics.doa(
            records['user'], records['item'], records['label'], theta, index.stacked_item_attributes
        )
    row.update(
        best_epoch=result.best_epoch,
        best_validation_loss=result.best_validation_loss,
        seconds_per_epoch=float(np.median([h['seconds'] for h in result.history])),
        seconds_per_round=None,
    )
    return row, theta
