"""The configuration of the FedDVA experiment (`fedpersonal.tasks.feddva`).

Kept apart from the task so that defining and parsing the binary's flags imports neither TensorFlow nor TFF
(`experiments/feddva.py --help`); `fedpersonal.tasks.feddva` re-exports every name (and
`fedpersonal.tasks.feddva_analysis` the settings and methods).

Example:

>>> config = FeddvaConfig(settings=('heterogeneous_inputs',), num_clients=4)
>>> config.architecture in ARCHITECTURE_NAMES, config.simulation
(True, 'engine')
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fedpersonal import errors
from fedpersonal.program import config_parts as parts
from fedpersonal.program import dataset_inference

if TYPE_CHECKING:
    from fedpersonal.models import feddva_networks

DATASETS = ('synthetic', 'mnist', 'fashion_mnist', 'cifar10')
# Deprecated --dataset values (kept for one release): the generated data is 'synthetic' in every binary.
DATASET_ALIASES = {'generated': 'synthetic'}
SETTINGS = ('heterogeneous_inputs', 'heterogeneous_outputs')
METHODS = ('feddva', 'feddva_tuned', 'fedavg', 'fedavg_ft', 'ditto')
ARCHITECTURE_NAMES = ('paper', 'scaled')  # The keys of `architectures()`.
DECODER_C_SOURCES = ('prior', 'posterior')  # Those of `feddva_models.LossWeights`.
# The files of every dataset read from --data_dir (for --dataset inferred from them).
DATA_LAYOUTS = {
    'mnist': dataset_inference.MNIST,
    'fashion_mnist': dataset_inference.FASHION_MNIST,
    'cifar10': dataset_inference.CIFAR10,
}


def architectures() -> dict[str, feddva_networks.DvaArchitecture]:
    """The model sizes `--architecture` names (imports `fedpersonal.models.feddva_networks`, hence TensorFlow).

    Returns:
      {name: architecture} for every name of `ARCHITECTURE_NAMES`: 'paper' (the paper's sizes) and 'scaled'.
    """
    from fedpersonal.models import feddva_networks  # pylint: disable=g-import-not-at-top  # TensorFlow.

    return {'paper': feddva_networks.PAPER, 'scaled': feddva_networks.SCALED}


@dataclasses.dataclass(frozen=True, kw_only=True)
class FeddvaConfig(
    parts.CrossDeviceRunConfig,
    parts.EarlyStoppingConfig,
    parts.ClientEpochsConfig,
    parts.SimulationConfig,
    parts.DifferentialPrivacyConfig,
):
    """Everything a FedDVA experiment needs (shared options from `fedpersonal.program.config_parts`; defaults: a
    small run on the generated data)."""

    dataset: str = parts.option(
        dataset_inference.AUTO, dataset_inference.dataset_help(DATASETS, 'synthetic'), value_aliases=DATASET_ALIASES
    )
    settings: tuple[str, ...] = parts.option(SETTINGS, f'Personalization settings, a subset of {SETTINGS}.')
    configurations: tuple[str, ...] = parts.option(
        METHODS, f'Rows (methods) to run, a subset of {METHODS}.', aliases=('methods',)
    )
    num_clients: int = parts.option(20, 'Clients.')
    train_per_client: int = parts.option(300, 'Training images per client.')
    test_per_client: int = parts.option(100, 'Test images per client.')
    validation_per_client: int = parts.option(
        0,
        "Validation images per client, held out from the client's draw of training images (same class fractions "
        'and marks). With a validation split every row is selected on it: the periodic evaluation measures '
        'validation and test accuracy, early stopping (early_stopping_patience) watches validation, and a row '
        'reports the test accuracy of its best validation round. 0: no selection, the last round is tested.',
    )
    alpha_inputs: float = parts.option(100.0, 'Dirichlet concentration of the label split (input heterogeneity).')
    alpha_outputs: float = parts.option(0.5, 'Dirichlet concentration of the label split (output heterogeneity).')
    marks_in_outputs: bool = parts.option(False, 'Add client marks in the output-heterogeneity setting too.')
    synthetic_train: int = parts.option(12000, 'Generated data: training images.', aliases=('generated_train',))
    synthetic_test: int = parts.option(2000, 'Generated data: test images.', aliases=('generated_test',))
    architecture: str = parts.option('scaled', f'One of {ARCHITECTURE_NAMES}.')
    z_dim: int = parts.option(8, 'Dimension of the shared latent z.')
    c_dim: int = parts.option(8, 'Dimension of the client latent c.')
    head_hidden: int = parts.option(0, 'Hidden units of the classifier head (0: linear).')
    total_rounds: int = 20
    clients_per_round: int = 20
    batch_size: int = 64
    learning_rate: float = parts.option(1e-3, 'Adam learning rate of the VAE phases (and FedAvg baselines).')
    decoder_epochs: int = parts.option(1, 'Epochs of the decoder phase per round.')
    z_epochs: int = parts.option(1, 'Epochs of the z-encoder phase per round.')
    c_epochs: int = parts.option(1, 'Epochs of the c-encoder phase per round.')
    head_epochs: int = parts.option(1, 'Epochs of the head phase per round.')
    head_learning_rate: float = parts.option(1e-2, 'Adam learning rate of the head phase.')
    lambda_c: float = parts.option(1.0, 'Weight of the c regularizer.')
    lambda_cc: float = parts.option(0.75, 'Weight of the c consistency term.')
    xi: float | None = parts.option(None, "xi of the loss ('none': the paper's default).")
    decoder_c_source: str = parts.option('posterior', "Decoder's c: 'prior' or 'posterior'.")
    cnn_channels: tuple[int, ...] = parts.option((16, 32, 64), 'Channels of the CNN baselines.')
    cnn_dense: int = parts.option(64, 'Dense units of the CNN baselines.')
    ditto_lambda: float = parts.option(0.1, "Ditto's lambda.")
    ditto_personal_learning_rate: float = parts.option(0.05, "Ditto's personal SGD learning rate.")
    finetune_epochs: int = parts.option(2, 'Fine-tuning epochs of FedAvg + fine-tuning.')
    finetune_learning_rate: float = parts.option(1e-3, 'Fine-tuning learning rate.')
    rounds_per_eval: int = 5
    state_store: str = parts.option(
        'sqlite',
        "Where each client's private state (decoder, head, batch-norm statistics; Ditto's personal model) "
        "lives between rounds: 'sqlite' (in the run's output directory, so an interrupted run resumes) or 'memory'.",
    )
    disentanglement_setting: str = parts.option('heterogeneous_inputs', 'Setting analysed for disentanglement.')
    grid_size: int = parts.option(6, 'Manifold grid size.')
    projection: str = parts.option('tsne', 'Projection of the latent codes.')
    projection_points: int = parts.option(1000, 'Points projected.')

    def __post_init__(self):
        parts.run_post_inits(self)
        parts.refuse_dp(
            self,
            "FedDVA's builder aggregates its global update with a fixed example-weighted mean (no model_aggregator "
            'to put a DP aggregator in); DP is available for FedRecon/FedAvg (experiments/movielens_mf.py) and FURL.',
        )
        dataset_inference.resolve_dataset(self, generated='synthetic', layouts=DATA_LAYOUTS)
        if self.dataset not in DATASETS:
            raise errors.ConfigError(f'dataset must be one of {DATASETS}, got {self.dataset!r}.')
        if self.dataset in ('mnist', 'cifar10') and not self.data_dir:
            raise errors.ConfigError(
                f'dataset {self.dataset!r} needs --data_dir (the generated default is "synthetic").'
            )
        for field, allowed in (('settings', SETTINGS), ('configurations', METHODS)):
            values = getattr(self, field)
            unknown = [v for v in values if v not in allowed]
            if unknown or not values:
                raise errors.ConfigError(f'{field} must be a non-empty subset of {allowed}; unknown: {unknown}.')
        if self.architecture not in ARCHITECTURE_NAMES:
            raise errors.ConfigError(f'architecture must be one of {ARCHITECTURE_NAMES}, got {self.architecture!r}.')
        if self.state_store not in ('sqlite', 'memory'):
            raise errors.ConfigError(f"state_store must be 'sqlite' or 'memory', got {self.state_store!r}.")
        if self.disentanglement_setting not in SETTINGS + ('none',):
            raise errors.ConfigError(f'disentanglement_setting must be one of {SETTINGS + ("none",)}.')
        for name in ('num_clients', 'train_per_client', 'test_per_client', 'z_dim', 'c_dim'):
            if getattr(self, name) < 1:
                raise errors.ConfigError(f'{name} must be >= 1, got {getattr(self, name)}.')
        if self.validation_per_client < 0:
            raise errors.ConfigError(f'validation_per_client must be >= 0, got {self.validation_per_client}.')
        if self.early_stopping_patience and not self.validation_per_client:
            raise errors.ConfigError(
                'early_stopping_patience needs a validation split (validation_per_client > 0): early stopping on '
                'the test images would select on test.'
            )
        if self.decoder_c_source not in DECODER_C_SOURCES:
            raise errors.ConfigError(f"decoder_c_source must be 'prior' or 'posterior', got {self.decoder_c_source!r}.")

    @property
    def source_dataset(self) -> str:
        """`dataset` as `fedpersonal.data.federated_images.load_source` names it (the synthetic data 'generated')."""
        return 'generated' if self.dataset == 'synthetic' else self.dataset

    def dva_architecture(self, image_shape: tuple[int, int, int], num_classes: int) -> feddva_networks.DvaArchitecture:
        """The `--architecture` sizes with this config's latent dimensions and head, for the given data.

        Args:
          image_shape: (height, width, channels) of the images.
          num_classes: Classes of the labels.

        Returns:
          The architecture of the dual VAE.
        """
        return dataclasses.replace(
            architectures()[self.architecture],
            image_shape=image_shape,
            z_dim=self.z_dim,
            c_dim=self.c_dim,
            head_hidden=self.head_hidden,
            num_classes=num_classes,
        )
