"""Federated algorithms: one `build_*` per method and baseline."""

from fedpersonal.algorithms.dataset_split import ReconstructionSplit
from fedpersonal.algorithms.dataset_split import build_dataset_split_fn
from fedpersonal.algorithms.fed_recon import build_fed_recon
from fedpersonal.algorithms.furl import build_furl
from fedpersonal.algorithms.hpfl import build_hpfl
from fedpersonal.algorithms.hpfl_baselines import build_baseline as build_hpfl_baseline
