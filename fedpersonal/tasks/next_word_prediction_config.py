"""The configuration of the next-word-prediction experiment (`fedpersonal.tasks.next_word_prediction`).

Kept apart from the task so that defining and parsing the binary's flags imports neither TensorFlow nor TFF
(`experiments/next_word_prediction.py --help`); `fedpersonal.tasks.next_word_prediction` re-exports every name.

Example:

>>> config = NextWordPredictionConfig(vocab_sizes=(100,), total_rounds=2)
>>> config.server_optimizer, config.num_oov_buckets
('yogi', 500)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fedpersonal import errors
from fedpersonal.program import config_parts as parts
from fedpersonal.program import dataset_inference

if TYPE_CHECKING:
    from fedpersonal import algorithms

CONFIGURATIONS = ('fedyogi', 'fedrecon_1oov', 'fedrecon', 'oov_finetuning', 'full_finetuning', 'fedrecon_finetune')
DATASETS = ('synthetic_text', 'shakespeare', 'stackoverflow')
# The files of every dataset read from --data_dir (for --dataset inferred from them).
DATA_LAYOUTS = {'shakespeare': dataset_inference.SHAKESPEARE, 'stackoverflow': dataset_inference.STACKOVERFLOW}


@dataclasses.dataclass(frozen=True, kw_only=True)
class NextWordPredictionConfig(
    parts.CrossDeviceRunConfig,
    parts.EvalClientsConfig,
    parts.ClientOptimizerConfig,
    parts.ServerOptimizerConfig,
    parts.ReconstructionOptimizerConfig,
    parts.SimulationConfig,
    parts.EarlyStoppingConfig,
    parts.DifferentialPrivacyConfig,
):
    """Everything a next-word-prediction experiment needs (shared options from `fedpersonal.program.config_parts`).

    Paper settings (Stack Overflow): vocabularies 1K/5K/10K, 500 OOV buckets,
    sequences of 20 tokens, at most 1024 examples per client, embedding 96,
    LSTM 670, FedYogi. Defaults here are CPU-sized (see `docs/RESULTS.md`).
    """

    dataset: str = parts.option(dataset_inference.AUTO, dataset_inference.dataset_help(DATASETS, 'synthetic_text'))
    configurations: tuple[str, ...] = parts.option(CONFIGURATIONS, f'Rows to run, a subset of {CONFIGURATIONS}.')
    vocab_sizes: tuple[int, ...] = parts.option((1000, 5000, 10000), 'Vocabulary sizes (one table per size).')
    num_oov_buckets: int = parts.option(500, 'Local OOV embedding rows of FedRecon (B).')
    max_sequence_length: int = parts.option(20, 'Tokens per sequence.')
    max_examples_per_client: int = parts.option(128, 'Sequences kept per client.', aliases=('max_elements_per_client',))
    min_examples_per_client: int = parts.option(20, 'Clients with fewer sequences are dropped.')
    synthetic_num_clients: int = parts.option(300, 'Generated corpus: clients.')
    test_fraction: float = parts.option(0.2, 'Fraction of clients held out for test.')
    validation_fraction: float = parts.option(0.1, 'Fraction of clients held out for validation.')
    embedding_dim: int = parts.option(32, 'Word embedding dimension.')
    lstm_units: int = parts.option(64, 'LSTM units.')
    total_rounds: int = 60
    client_learning_rate: float = 1.0
    server_optimizer: str = 'yogi'
    server_learning_rate: float = 0.1
    reconstruction_learning_rate: float = 1.0
    finetune_learning_rate: float = parts.option(0.1, 'Learning rate of the fine-tuning rows.')
    train_support_overlap: bool = parts.option(
        False,
        "FedRecon training reconstructs and updates on all of a client's examples (the paper's Appendix D option "
        'for clients with little data); evaluation keeps disjoint support and query sets.',
    )
    rounds_per_eval: int = 30
    eval_clients: int = 20
    test_clients: int | None = parts.option(None, "Test clients evaluated at the end ('none': all).")
    rounds_per_checkpoint: int = 50

    def __post_init__(self):
        parts.run_post_inits(self)
        parts.refuse_dp(
            self,
            'the next-word-prediction rows are not wired to the DP aggregator (their per-client path measures '
            'communication with an aggregator of its own); DP is available for FedRecon/FedAvg '
            '(experiments/movielens_mf.py) and FURL.',
        )
        dataset_inference.resolve_dataset(self, generated='synthetic_text', layouts=DATA_LAYOUTS)
        unknown = [c for c in self.configurations if c not in CONFIGURATIONS]
        if unknown or not self.configurations:
            raise errors.ConfigError(
                f'configurations must be a non-empty subset of {CONFIGURATIONS}; unknown: {unknown}.'
            )
        if self.dataset not in DATASETS:
            raise errors.ConfigError(f'dataset must be one of {DATASETS}, got {self.dataset!r}.')
        if self.dataset == 'stackoverflow' and not self.data_dir:
            raise errors.ConfigError(
                'dataset=stackoverflow needs --data_dir (a stackoverflow.sqlite file or its directory).'
            )
        if not self.vocab_sizes or min(self.vocab_sizes) < 1:
            raise errors.ConfigError(f'vocab_sizes must be positive, got {self.vocab_sizes}.')
        for name in (
            'num_oov_buckets',
            'max_sequence_length',
            'max_examples_per_client',
            'embedding_dim',
            'lstm_units',
        ):
            if getattr(self, name) < 1:
                raise errors.ConfigError(f'{name} must be >= 1, got {getattr(self, name)}.')

    @property
    def split(self) -> algorithms.ReconstructionSplit:
        """Support = the first half of a client's examples in time order (the paper's Stack Overflow setup).

        Evaluation always uses this split; FedRecon training uses it with `allow_overlap=train_support_overlap`.
        """
        from fedpersonal import algorithms  # pylint: disable=g-import-not-at-top  # TensorFlow.

        return algorithms.ReconstructionSplit(
            support_fraction=0.5,
            strategy='order',
            recon_epochs=self.recon_epochs,
            recon_steps_max=self.recon_steps_max,
            post_recon_epochs=self.post_recon_epochs,
            post_recon_steps_max=self.post_recon_steps_max,
        )
