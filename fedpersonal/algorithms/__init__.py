"""Federated algorithms: one `build_*` per method and baseline, each a short composition of `fedpersonal.core`.

Every builder returns a `fedpersonal.core.PersonalizedProcess` (`initialize`, `next` returning a
`ProcessOutput(state, metrics, private_states)`, `get_model_weights`):

* `build_fed_recon`: Federated Reconstruction (stateless: local variables reconstructed every round);
* `build_fed_avg`: weighted FedAvg (every variable global), as FedRecon's special case; both one client plan
  (`fed_recon.fed_recon_plan`) run by every backend;
* `build_furl`: FURL (private parameters persisted on stateful clients);
* `build_ditto`: Ditto (personal models as private state);
* `build_fedprox`: FedProx (FedAvg with a proximal term to the received model);
* `build_fedper`, `build_fedrep`: FedPer and FedRep (shared body, personal head as private state),
  `build_lg_fedavg`: LG-FedAvg (personal representation, shared head), and
  `build_apfl`: APFL (a personal model mixed with the global one by a learned alpha), each a
  `fedpersonal.core.client_plan.ClientPlan` run by every backend (`fedpersonal.backends`);
* `build_fedbn`: FedBN (batch norm layers local, the rest FedAvg) and `build_fedbabu`: FedBABU (the body trained
  and averaged with the head frozen at its initial values), each a client plan run by every backend;
* `build_per_fedavg`: Per-FedAvg (a meta-learned global model, first-order or Hessian-free) and `build_pfedme`:
  pFedMe (personalized theta solving a proximal inner problem per batch), plans with a step kind
  (`fedpersonal.core.step_kinds`) run by every backend;
* `build_fedala`: FedALA (each client's model aggregated element-wise with the global one by learned weights at
  the start of its round, a `fedpersonal.core.client_start.ClientStart`; every backend) and `build_fedrod`:
  FedRoD (a shared body and balanced-softmax generic head, a personal head as private state; a plan of
  model-defined losses, every backend);
* `build_feddva`: FedDVA (shared dual encoders, private decoders and heads);
* `build_hpfl`, `build_hpfl_baseline`: HPFL and its federated baselines on the GUM;
* `compose_personalized_process`: the composer for a new method (see docs/ARCHITECTURE.md).

`fedpersonal.tff_compat` has TFF 0.87's `build_fed_recon` / `build_fed_recon_eval` with TFF's signatures
and return types, for code ported from `tff.learning` (docs/MIGRATING.md). `ReconstructionSplit` and
`build_dataset_split_fn` (the support/query split, `fedpersonal.data.dataset_split`) are re-exported here, where
FedRecon's users reach for them.
"""

from fedpersonal.algorithms.apfl import build_apfl
from fedpersonal.algorithms.ditto import build_ditto
from fedpersonal.algorithms.fed_avg import build_fed_avg
from fedpersonal.algorithms.fed_recon import build_fed_recon
from fedpersonal.algorithms.fedala import build_fedala
from fedpersonal.algorithms.fedbabu import build_fedbabu
from fedpersonal.algorithms.fedbn import build_fedbn
from fedpersonal.algorithms.feddva import build_feddva
from fedpersonal.algorithms.fedper import build_fedper
from fedpersonal.algorithms.fedprox import build_fedprox
from fedpersonal.algorithms.fedrep import build_fedrep
from fedpersonal.algorithms.fedrod import build_fedrod
from fedpersonal.algorithms.furl import build_furl
from fedpersonal.algorithms.hpfl import build_baseline as build_hpfl_baseline
from fedpersonal.algorithms.hpfl import build_hpfl
from fedpersonal.algorithms.lg_fedavg import build_lg_fedavg
from fedpersonal.algorithms.per_fedavg import build_per_fedavg
from fedpersonal.algorithms.pfedme import build_pfedme
from fedpersonal.core.compose import compose_personalized_process
from fedpersonal.data.dataset_split import ReconstructionSplit
from fedpersonal.data.dataset_split import build_dataset_split_fn

__all__ = [
    'ReconstructionSplit',
    'build_apfl',
    'build_dataset_split_fn',
    'build_ditto',
    'build_fed_avg',
    'build_fed_recon',
    'build_fedala',
    'build_fedbabu',
    'build_fedbn',
    'build_feddva',
    'build_fedper',
    'build_fedprox',
    'build_fedrep',
    'build_fedrod',
    'build_furl',
    'build_hpfl',
    'build_hpfl_baseline',
    'build_lg_fedavg',
    'build_per_fedavg',
    'build_pfedme',
    'compose_personalized_process',
]
