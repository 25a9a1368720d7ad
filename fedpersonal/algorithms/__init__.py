"""Federated algorithms: one `build_*` per method and baseline."""

from fedpersonal.algorithms.dataset_split import ReconstructionSplit
from fedpersonal.algorithms.dataset_split import build_dataset_split_fn
from fedpersonal.algorithms.fed_recon import build_fed_recon
