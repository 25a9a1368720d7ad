"""Evaluation of every algorithm's output, in one place.

* `build_recon_eval`: ReconEval (FedRecon): reconstruct local variables on each client's support set (from their
  initializer or a learned default), optionally fine-tune the globals (FedRecon+Finetune), score the query set;
  works for clients never seen in training.
* `build_fed_recon_eval`: the same ReconEval as TFF 0.87's `build_fed_recon_eval` builds it, a
  `tff.learning.templates.LearningProcess` (`initialize`, `set_model_weights`, `next`; TFF's argument names).
* `build_standard_eval`: the given weights on each client's whole dataset (no reconstruction).
* `build_private_state_eval`: stateful methods (FURL, FedPer, ...): each client with its stored private state, or
  with `process.initial_private_state()` for a new client.
* `evaluate_clients`: runs any of these on clients by id, building their datasets on demand.

They run on the backend of the context, as training does (`fedpersonal.backends.use`): the fast simulation engine
by default (many clients' evaluation as compiled groups, `fedpersonal.simulation.evaluation`), equal to the
per-client TFF computations (``with backends.use('per_client'):``).
* `predict_silos`: HPFL and its baselines: every silo's predictions with its own personalized GUM (metrics in
  `fedpersonal.metrics.user_modeling_metrics`).
* `disentanglement`: FedDVA's linear probes, manifold grids and projections.

Every federated evaluation returns the example-weighted aggregate and each client's own metrics, for
distributions (`fedpersonal.metrics.summarize_per_client`).
"""

from fedpersonal.algorithms.hpfl.evaluation import predict_silos
from fedpersonal.evaluation.fed_recon_eval import build_fed_recon_eval
from fedpersonal.evaluation.federated_evaluation import Evaluation
from fedpersonal.evaluation.federated_evaluation import build_private_state_eval
from fedpersonal.evaluation.federated_evaluation import build_recon_eval
from fedpersonal.evaluation.federated_evaluation import build_standard_eval
from fedpersonal.evaluation.federated_evaluation import evaluate_clients

__all__ = [
    'Evaluation',
    'build_fed_recon_eval',
    'build_private_state_eval',
    'build_recon_eval',
    'build_standard_eval',
    'evaluate_clients',
    'predict_silos',
]
