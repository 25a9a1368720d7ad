"""The configuration of the personalization benchmark (`fedpersonal.tasks.pfl_benchmark`, PFLlib's leaderboard).

Kept apart from the task so that the binary's flags import neither TensorFlow nor TFF. Defaults are PFLlib's
leaderboard settings (20 clients, every client every round, its 4-layer CNN, batch 10, SGD 0.005, 1 local epoch)
except the rounds (2000 there; see docs/RESULTS.md for the budget here).

Example:

>>> config = PflBenchmarkConfig(dataset='synthetic', partition='dirichlet', configurations=('fedavg', 'fedper'))
>>> config.num_clients, config.batch_size, config.client_learning_rate
(20, 10, 0.005)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from fedpersonal import errors
from fedpersonal import registry
from fedpersonal.program import config_parts as parts

DATASETS = ('fashion_mnist', 'mnist', 'synthetic', 'npz', 'movielens', 'movielens_synthetic')
NPZ = 'npz'  # A user's own images: `fedpersonal.data.npz_images` (--data_path).
# The MovieLens block (`fedpersonal.tasks.pfl_benchmark_movielens`): matrix factorization, its own methods.
MOVIELENS_DATASETS = ('movielens', 'movielens_synthetic')
MOVIELENS_METHODS = ('fedavg', 'fedavg_ft', 'fed_recon', 'fedper', 'furl', 'ditto')
EPOCH_ORDERS = ('reshuffled', 'fixed')
PARTITIONS = ('pathological', 'dirichlet', 'iid')  # Those of `fedpersonal.data.pfllib.SETTINGS`.
# Every algorithm module's rows and options (`fedpersonal.registry`, read from their source: no TensorFlow).
DECLARATIONS = registry.declarations()
# PFLlib's leaderboard rows, run by default, and the rows beyond them, run when named (--configurations).
METHODS, EXTRA_METHODS, _ROW_NAMES = registry.row_names(DECLARATIONS)
METHOD_NAMES = {**_ROW_NAMES, 'furl': 'FURL'}  # FURL: the MovieLens block's.


@dataclasses.dataclass(frozen=True, kw_only=True)
@registry.add_option_fields(DECLARATIONS)  # --<module>_<option> of every algorithm module, e.g. --fedprox_mu.
class PflBenchmarkConfig(
    parts.OutputConfig,
    parts.DataConfig,
    parts.RoundsConfig,
    parts.EvaluationConfig,
    parts.BatchConfig,
    parts.ClientEpochsConfig,
    parts.SimulationConfig,
):
    """Everything a benchmark run needs: the data and its partition, the methods and their hyperparameters."""

    dataset: str = parts.option(
        'fashion_mnist',
        f'One of {DATASETS}: fashion_mnist (--data_dir, default /usr/share/datasets/fashion-mnist from the Debian '
        'package dataset-fashion-mnist, or a prepared TFDS directory), mnist (--data_dir), synthetic (generated), '
        'npz (your own images: --data_path, a .npz of x [N, H, W(, C)] and integer labels y [N]; results are '
        'labelled by the file name); movielens (MovieLens 100K, --data_dir holding u.data) and movielens_synthetic (generated MovieLens-shaped '
        f'ratings): the rating block, methods {MOVIELENS_METHODS}.',
    )
    data_path: str | None = parts.option(
        None,
        '--dataset=npz: a .npz file with arrays x (images [N, H, W] or [N, H, W, C], any size and channel count; '
        'uint8 pixels are divided by 255, others in [0, 1] kept, any other range min-max scaled, then (x - 0.5) / '
        '0.5 as for MNIST) and y (integer labels [N], classes 0..K-1), e.g. np.savez("digits.npz", x=..., y=...). '
        'Pooled and partitioned across the clients as the leaderboard datasets are; the results are labelled by '
        "the file's stem (digits).",
        is_path=True,
    )
    model: str | None = parts.option(
        None,
        "The image model: a Keras model factory by import path, 'module:function' (e.g. "
        'mypackage.models:small_cnn; the module must be importable, e.g. on PYTHONPATH), called with those of '
        'input_shape (H, W, C), num_classes and seed its signature accepts, returning an uncompiled tf.keras.Model '
        'that outputs logits [batch, num_classes]. Methods with a local head (fedper, fedrep, lg_fedavg, fedbabu, '
        "fed_recon, furl_head, fedrod) use its last layer as the head, which must then be a Dense layer. 'none': "
        "PFLlib's 4-layer CNN (the leaderboard's), which needs images of at least 16 x 16 "
        '(fedpersonal.models.image_classifiers:small_cnn fits any size).',
    )
    tfds_data_dir: str | None = parts.option(
        None,
        "TFDS data directory to read mnist/fashion_mnist from ('none': TFDS's default; '' turns TFDS off).",
        is_path=True,
    )
    partition: str = parts.option('pathological', f'Label skew, one of {PARTITIONS} (PFLlib: pat, dir, iid).')
    num_clients: int = parts.option(
        20,
        'Clients (every client trains every round). Each needs at least --batch_size train rows: a last partial '
        'train batch is dropped (as PFLlib drop_last; the dropped rows are logged and recorded in results.json), '
        'so a client with fewer would never train yet be scored, and a partition leaving one is refused, naming '
        'the clients.',
    )
    class_per_client: int = parts.option(2, 'Pathological partition: classes per client.')
    dirichlet_alpha: float = parts.option(0.1, 'Dirichlet partition: concentration.')
    train_ratio: float = parts.option(0.75, "Each client's train share (the rest is its test data).")
    partition_seed: int = parts.option(1, "The partition's seed (PFLlib's: 1, which reproduces its partition).")
    synthetic_examples: int = parts.option(4000, 'Synthetic data: pooled images.')
    configurations: tuple[str, ...] = parts.option(
        METHODS,
        f'Rows (methods) to run, a subset of {METHODS + EXTRA_METHODS} (default: the first {len(METHODS)}; MovieLens: of '
        f'{MOVIELENS_METHODS}, all by default); may change when a run resumes (finished runs are read '
        'back, the others run).',
        aliases=('methods',),
        may_change_on_resume=True,
    )
    seeds: tuple[int, ...] = parts.option(
        (0, 1, 2),
        'Seeds: every method runs once per seed (its own directory <output_dir>/<method>/seed<k>), a row is the mean '
        "and standard deviation over them. A seed sets the initial weights and the order of each client's train "
        'examples; the partition stays the one of --partition_seed. May change when a run resumes (finished runs '
        'are read back, the others run). Replaces --seed, which is set per run.',
        may_change_on_resume=True,
    )
    total_rounds: int = 100
    batch_size: int = parts.option(
        10, "Client batch size (PFLlib: 10); a client's last partial train batch is dropped (see --num_clients)."
    )
    rounds_per_eval: int = 5
    epoch_order: str = parts.option(
        'reshuffled',
        "The order of a client's train examples: 'reshuffled', a new one every round, drawn from the seed and the "
        "round (PFLlib's DataLoader(shuffle=True) draws one every epoch; with --client_epochs > 1 the epochs of a "
        "round share it here), so the last partial batch dropped differs between rounds; 'fixed', the seed's order "
        "every round (docs/RESULTS.md's tables ran with it; the cross-check's exact mode needs it). Engine workers "
        "(--engine_workers) need 'fixed'.",
    )
    client_learning_rate: float = parts.option(0.005, 'SGD learning rate of every local model (PFLlib: 0.005).')
    client_learning_rates: tuple[float, ...] = parts.option(
        (),
        'MovieLens: client learning rates to select from, per method, on the validation ratings (the 10% between '
        'train and test) with the first of --seeds; the other seeds run with the selected one (default: only '
        '--client_learning_rate). May change when a run resumes (finished runs are read back).',
        may_change_on_resume=True,
    )
    personal_epochs: int = parts.option(
        1, 'Epochs of the personal model per round (Ditto, APFL; PFLlib: plocal_epochs).'
    )
    finetune_epochs: int = parts.option(
        5, 'Epochs each client fine-tunes the whole model on its train data before evaluation (FedBABU, FedAvg+FT).'
    )
    num_latent_factors: int = parts.option(50, 'MovieLens: embedding dimension.')
    max_examples_per_client: int | None = parts.option(
        300, "MovieLens: ratings kept per user, the earliest ('none': all)."
    )
    reconstruction_learning_rate: float = parts.option(
        0.1, "MovieLens FedRecon: SGD learning rate of the user embedding's reconstruction."
    )
    synthetic_users: int = parts.option(943, 'movielens_synthetic: users (clients).')
    synthetic_items: int = parts.option(1682, 'movielens_synthetic: items.')
    state_store: str = parts.option(
        'sqlite',
        "Where each client's private state lives between rounds: 'sqlite' (in the run's output directory, so an "
        "interrupted run resumes) or 'memory'.",
    )

    def __post_init__(self):
        parts.run_post_inits(self)
        for field, allowed in (('dataset', DATASETS), ('partition', PARTITIONS)):
            if getattr(self, field) not in allowed:
                raise errors.ConfigError(f'{field} must be one of {allowed}, got {getattr(self, field)!r}.')
        methods = MOVIELENS_METHODS if self.dataset in MOVIELENS_DATASETS else METHODS + EXTRA_METHODS
        if methods is MOVIELENS_METHODS and self.configurations == METHODS:  # The default: every MovieLens method.
            object.__setattr__(self, 'configurations', MOVIELENS_METHODS)
        unknown = [m for m in self.configurations if m not in methods]
        if unknown or not self.configurations:
            raise errors.ConfigError(
                f'configurations of dataset {self.dataset!r} must be a non-empty subset of {methods}; unknown: '
                f'{unknown}.'
            )
        if self.client_learning_rates and self.dataset not in MOVIELENS_DATASETS:
            raise errors.ConfigError(
                '--client_learning_rates: only the MovieLens block has a validation split to select on (the image '
                "block's partitions are PFLlib's train/test split); pass --client_learning_rate."
            )
        rates = self.client_learning_rates
        if min(rates, default=1.0) <= 0 or len(set(rates)) != len(rates) or self.client_learning_rate <= 0:
            raise errors.ConfigError(
                f'client_learning_rate(s) must be positive and distinct, got {self.client_learning_rate}, {list(rates)}.'
            )
        if self.dataset == 'movielens' and not self.data_dir:
            raise errors.ConfigError(
                "dataset 'movielens' needs --data_dir (a directory holding MovieLens 100K's u.data)."
            )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise errors.ConfigError(f'seeds must be distinct non-negative integers, got {list(self.seeds)}.')
        if self.seed != 0 and self.seed not in self.seeds:  # Each run sets --seed to one of --seeds.
            raise errors.ConfigError(f'--seed={self.seed} is not one of --seeds={list(self.seeds)}; pass --seeds.')
        if self.dataset == 'mnist' and not self.data_dir and self.tfds_data_dir is None:
            raise errors.ConfigError("dataset 'mnist' needs --data_dir (or --tfds_data_dir).")
        for name in (
            'num_clients',
            'class_per_client',
            'synthetic_examples',
            'personal_epochs',
            'finetune_epochs',
            'num_latent_factors',
            'synthetic_users',
            'synthetic_items',
        ):
            if getattr(self, name) < 1:
                raise errors.ConfigError(f'{name} must be >= 1, got {getattr(self, name)}.')
        if not 0.0 < self.train_ratio < 1.0:
            raise errors.ConfigError(f'train_ratio must be in (0, 1), got {self.train_ratio}.')
        if self.dirichlet_alpha <= 0:
            raise errors.ConfigError(f'dirichlet_alpha must be > 0, got {self.dirichlet_alpha}.')
        for declaration in DECLARATIONS:  # Each algorithm's options, checked by its own BenchmarkOptions.
            registry.options_from(declaration, self)
        self._check_npz_and_model()
        if self.epoch_order not in EPOCH_ORDERS:
            raise errors.ConfigError(f'epoch_order must be one of {EPOCH_ORDERS}, got {self.epoch_order!r}.')
        if self.state_store not in ('sqlite', 'memory'):
            raise errors.ConfigError(f"state_store must be 'sqlite' or 'memory', got {self.state_store!r}.")

    def algorithm_option(self, flag: str) -> Any:
        """The value of an algorithm module's option by its flag's name (e.g. ``'ditto_lambda'``; `registry`)."""
        if flag not in {d.flag(f.name) for d in DECLARATIONS for f in d.fields()}:
            raise KeyError(f'{flag} is no algorithm option of the benchmark.')
        return getattr(self, flag)

    def _check_npz_and_model(self) -> None:
        """--data_path goes with --dataset=npz, --model with the image datasets; --model is 'module:function'."""
        if self.dataset == NPZ:
            if not self.data_path:
                raise errors.ConfigError(
                    '--dataset=npz needs --data_path (a .npz file with arrays x, the images, and y, the labels).'
                )
            if not os.path.isfile(self.data_path):
                state = 'is a directory' if os.path.isdir(self.data_path) else 'does not exist'
                raise errors.ConfigError(f'--data_path={self.data_path} {state} (expected a .npz file).')
            if self.data_dir:
                raise errors.ConfigError(
                    f'--dataset=npz reads --data_path={self.data_path}; --data_dir={self.data_dir} names another '
                    'dataset: drop one of them.'
                )
        elif self.data_path:
            raise errors.ConfigError(
                f'--data_path applies to --dataset=npz only, got --dataset={self.dataset}: pass --dataset=npz to '
                'read your own images, or drop it.'
            )
        if self.model is None:
            return
        if self.dataset in MOVIELENS_DATASETS:
            raise errors.ConfigError(
                f'--model is the image model; --dataset={self.dataset} trains matrix factorization: drop --model.'
            )
        module, _, function = self.model.partition(':')
        if not module or not function or not all(part.isidentifier() for part in module.split('.') + [function]):
            raise errors.ConfigError(
                f"--model={self.model}: expected a Keras model factory as 'module:function' (e.g. "
                'mypackage.models:small_cnn).'
            )
