"""One FedDVA round as a benchmark workload: the task's clients, datasets and process, per simulation path.

`round_workload` builds what `fedpersonal.tasks.feddva.run_feddva` trains on (one setting's federated data, the
task's client datasets with their seeded reshuffling, the process with the config's hyperparameters), so a
benchmark can time ``process.run_round`` for ``simulation='per_client'`` and ``'engine'``:

    config = FeddvaConfig(**values)  # e.g. from configs/feddva_scaled.flags, dataset='mnist', data_dir=...
    workload = round_workload(config)
    process = workload.build('engine')
    state = process.initialize()
    ids = workload.sample(0)
    output = process.run_round(state, [workload.dataset_fn(c) for c in ids],
                               [process.initial_private_state()] * len(ids), client_ids=ids)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from fedpersonal.algorithms import feddva
from fedpersonal.data import federated_images
from fedpersonal.tasks import feddva as feddva_task


@dataclasses.dataclass
class Workload:
    """A FedDVA round's inputs.

    Attributes:
      client_ids: Every client of the setting.
      dataset_fn: Client id -> its batched training dataset (a fresh pipeline, as the training loop builds).
      clients_per_round: Sampled clients per round.
      build: ``simulation -> PersonalizedProcess`` ('per_client' or 'engine'; the config's group size).
      seed: The config's seed (client sampling).
      task: The `FeddvaTask` of the setting (its model functions, data and config).
    """

    client_ids: list[str]
    dataset_fn: Callable[[str], Any]
    clients_per_round: int
    build: Callable[[str], Any]
    seed: int
    task: feddva_task.FeddvaTask

    def sample(self, round_num: int) -> list[str]:
        from fedpersonal import program

        return program.sample_clients(self.client_ids, self.clients_per_round, round_num=round_num, seed=self.seed)


def round_workload(
    config: feddva_task.FeddvaConfig, *, setting: str = 'heterogeneous_inputs', head_tunes_encoders: bool = False
) -> Workload:
    """The FedDVA row (``feddva``, or ``feddva_tuned`` with `head_tunes_encoders`) of `setting` as a workload."""
    source = federated_images.load_source(
        config.source_dataset,
        config.data_dir,
        generated_train=config.synthetic_train,
        generated_test=config.synthetic_test,
        seed=config.seed,
    )
    task = feddva_task.FeddvaTask(config, feddva_task.load_setting(config, source, setting))
    model_fn = functools.partial(task.dva_fn, head_tunes_encoders)

    def build(simulation: str) -> Any:  # As run_feddva builds it.
        return feddva.build_feddva(
            model_fn,
            element_spec=task.element_spec,
            decoder_epochs=config.decoder_epochs,
            z_epochs=config.z_epochs,
            c_epochs=config.c_epochs,
            head_epochs=config.head_epochs,
            learning_rate=config.learning_rate,
            head_learning_rate=config.learning_rate if head_tunes_encoders else config.head_learning_rate,
            simulation=simulation,
            group_size=config.group_size,
        )

    dataset_fn = lambda cid: task.dataset_fn(task.train.create_tf_dataset_for_client(cid))
    return Workload(list(task.data.client_ids), dataset_fn, config.clients_per_round, build, config.seed, task)
