"""Federated evaluation: ReconEval (optionally with fine-tuning) and StandardEval."""

from fedpersonal.evaluation.federated_evaluation import build_private_state_eval
from fedpersonal.evaluation.federated_evaluation import build_recon_eval
from fedpersonal.evaluation.federated_evaluation import build_standard_eval
