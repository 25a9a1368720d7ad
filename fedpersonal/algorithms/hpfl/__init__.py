"""HPFL: hierarchical personalized federated learning for user modeling (Wu et al., WWW 2021), on TFF.

Cross-silo: a few clients (schools, regions), each with many users and items, all participating every round. Each
client holds a General User Model (`fedpersonal.models.gum`) whose *public* components (per-attribute knowledge
vectors c_k, `gum.attribute_vectors`) may be shared and whose *private* components (user and item tables) must not
be. HPFL is the package's one round with a server-side step after aggregation; its ablations and its federated
baselines are configurations of the same builder (`process.build_process(config, RoundSpec(...))`;
`baselines.round_spec(method)` names them). One round of HPFL's ``next``:

1. **Client upload phase** (``process.parts['client_update']``, TF): the client trains its own (personalized) GUM for
   ``client_epochs`` local epochs on its train split with a `tff.learning.optimizers` optimizer inside a
   `Dataset.reduce` loop (`training.local_training`), then measures on its **validation** split (not test: the
   authors' code measures on test, a leak) the accuracy Acc_ki of the records of each attribute k, its overall
   accuracy Acc_i, and counts I_ki, the number of training records involving attribute k that the round processed
   (records x epochs). Then (``process.parts['client_centres']``, TF) it runs k-means on its user embeddings theta and on
   its item difficulties b (rows of its real users/items only), with ``min(n // local_cluster_divisor + 1,
   max_local_clusters)`` clusters (about n/5 + 1, as in the authors' code; padded to the static
   ``max_local_clusters`` with a mask).
2. **Server, public components** (`server.PublicAggregation`; only with ``aggregate_public``): per attribute k,
   ``c_k^g = sum_i d(Acc_ki, p) I_ki Acc_ki c_ki / sum_i d(Acc_ki, p) I_ki Acc_ki`` with ``d(x, p) = 1 if x > p``.
   Each client uploads ``a_ki c_ki`` and ``a_ki`` (a client without validation records of attribute k, in
   particular one lacking the attribute, has Acc_ki = 0 and contributes nothing), they are summed with a
   `tff.aggregators` sum (default `SumFactory`, replaceable e.g. by a noised or secure sum) and the server
   divides; an attribute that no client passes keeps its previous global c_k. ``p`` is the configurable
   ``accuracy_threshold`` (the authors' code draws it at random).
3. **Server, private components** (`server.CentreClustering`; only with ``aggregate_private``): clients upload
   only their padded cluster centres (never user/item rows) through one `federated_aggregate` that concatenates
   them (at most ``max_clients`` uploads: more are dropped and counted in the metrics), and the server clusters
   all user centres (and, separately, all item centres) into ``min(total // global_cluster_divisor + 1,
   max_global_clusters)`` global centres Theta^g (about total/10) with the same deterministic TF k-means as the
   clients (`clustering.kmeans`: maximin initialization from the point nearest the mean, then Lloyd iterations;
   an empty cluster keeps its centre; TFF's mini-batch `build_fed_kmeans` does not fit, see `clustering`).
4. **Client update phase** (``process.parts['post_aggregation']``, TF), fine-grained personalized update:
   ``c_ki <- c_ki Acc_ki + c_k^g (1 - Acc_ki)`` (public, `aggregation.personalize_public`) and, for every real
   user (item) row, ``Emb^g = sum_n w_n Theta_n / sum_m w_m`` and ``Emb_ji <- Emb_ji Acc_i + Emb^g (1 - Acc_i)``
   (`aggregation.personalize_embeddings`), with ``w_n = ||Emb_ji - Theta_n||`` as published (farther centres
   weigh more; ``center_weighting='distance'``, the default) or ``w_n = 1 / ||Emb_ji - Theta_n||``
   (``center_weighting='inverse_distance'``).

The personalized model is the client's state for the next round: there is no broadcast before local training.
Ablations: HPFL-K = ``aggregate_public=True, aggregate_private=False`` (no clustering, no centre upload);
HPFL-R = ``aggregate_public=False, aggregate_private=True`` (public components stay local); both False is the
Distributed (local-only) baseline.

**Private state.** Each client's `ClientState` (its GUM weights -- public copy and private tables -- and its real
numbers of users and items) is the `fedpersonal.core.PersonalizedProcess`'s CLIENTS-placed private state, input
and output of `next`, as in FURL; nothing in the SERVER state (its `ServerState`) is per-client. Silos of different
sizes share one static type: user/item tables are padded to the largest silo (`gum.GumConfig.for_data`), the
item attribute table to ``max_items`` rows; the real sizes in the state mask padded rows out of clustering and of
the embedding update (padded rows are never indexed by the data). Client data is a `ClientData` (train and
validation datasets, the attribute table, a seed) built by `client_data` / `federated_data`.

**Privacy audit** (`fedpersonal.privacy.audit`): `next` decomposes into the client computations above and
``process.parts['round_from_uploads'](state, centres, reports, trained_states)``, whose explicit ``centres``
argument is the only way the trained tables reach the server; see tests/algorithms/hpfl_test.py.

Modules: `types` (the structures), `data` (client data, checks, initial states, a silo cut to its rows),
`training` (local epochs, FedSGD's gradient pass, validation statistics), `clustering` (k-means), `aggregation`
(formulas, FedAtt's aggregator), `server` (HPFL's server-side building blocks), `spec` (`RoundSpec`), `parts`
(distributor, client work, client step after aggregation), `server_step` (the round's server step), `process`
(`build_process`, `build_hpfl`), `baselines` (named configurations), `evaluation` (`predict_silos`). No module
names a backend: `build_process` gives the round to `fedpersonal.backends`.

    initialize: ( -> LearningAlgorithmState@SERVER)
    next: (<LearningAlgorithmState@SERVER, {ClientData}@CLIENTS, {ClientState}@CLIENTS> ->
           ProcessOutput<state=LearningAlgorithmState@SERVER, metrics@SERVER, private_states={ClientState}@CLIENTS>)
"""

from fedpersonal.algorithms.hpfl.aggregation import AttentionMeanFactory
from fedpersonal.algorithms.hpfl.aggregation import global_embedding
from fedpersonal.algorithms.hpfl.aggregation import personalize_embeddings
from fedpersonal.algorithms.hpfl.aggregation import personalize_public
from fedpersonal.algorithms.hpfl.aggregation import public_aggregation_weights
from fedpersonal.algorithms.hpfl.baselines import BASELINES
from fedpersonal.algorithms.hpfl.baselines import HPFL_VARIANTS
from fedpersonal.algorithms.hpfl.baselines import build_baseline
from fedpersonal.algorithms.hpfl.baselines import build_distributed
from fedpersonal.algorithms.hpfl.baselines import build_fedatt
from fedpersonal.algorithms.hpfl.baselines import build_fedavg
from fedpersonal.algorithms.hpfl.baselines import build_fednoise
from fedpersonal.algorithms.hpfl.baselines import build_fedprox
from fedpersonal.algorithms.hpfl.baselines import build_fedsgd
from fedpersonal.algorithms.hpfl.baselines import build_method
from fedpersonal.algorithms.hpfl.baselines import round_spec
from fedpersonal.algorithms.hpfl.clustering import kmeans
from fedpersonal.algorithms.hpfl.clustering import lloyd_step
from fedpersonal.algorithms.hpfl.clustering import maximin_init
from fedpersonal.algorithms.hpfl.data import batch_type
from fedpersonal.algorithms.hpfl.data import client_data
from fedpersonal.algorithms.hpfl.data import client_data_type
from fedpersonal.algorithms.hpfl.data import client_state_type
from fedpersonal.algorithms.hpfl.data import federated_data
from fedpersonal.algorithms.hpfl.data import initial_client_state
from fedpersonal.algorithms.hpfl.data import initial_client_states
from fedpersonal.algorithms.hpfl.data import split_dataset
from fedpersonal.algorithms.hpfl.evaluation import predict_silos
from fedpersonal.algorithms.hpfl.process import build_hpfl
from fedpersonal.algorithms.hpfl.process import build_process
from fedpersonal.algorithms.hpfl.spec import RoundSpec
from fedpersonal.algorithms.hpfl.training import client_round
from fedpersonal.algorithms.hpfl.training import finalize_metrics
from fedpersonal.algorithms.hpfl.training import gradient_round
from fedpersonal.algorithms.hpfl.training import local_training
from fedpersonal.algorithms.hpfl.training import metric_sums
from fedpersonal.algorithms.hpfl.training import validation_statistics
from fedpersonal.algorithms.hpfl.types import CENTER_WEIGHTINGS
from fedpersonal.algorithms.hpfl.types import ROW_UPDATES
from fedpersonal.algorithms.hpfl.types import SPLITS
from fedpersonal.algorithms.hpfl.types import Centres
from fedpersonal.algorithms.hpfl.types import ClientData
from fedpersonal.algorithms.hpfl.types import ClientReport
from fedpersonal.algorithms.hpfl.types import ClientState
from fedpersonal.algorithms.hpfl.types import GlobalCentres
from fedpersonal.algorithms.hpfl.types import GlobalComponents
from fedpersonal.algorithms.hpfl.types import HpflDataError
from fedpersonal.algorithms.hpfl.types import ServerState
from fedpersonal.algorithms.hpfl.types import SiloPredictions
from fedpersonal.algorithms.hpfl.types import global_components

__all__ = [
    'BASELINES',
    'CENTER_WEIGHTINGS',
    'HPFL_VARIANTS',
    'ROW_UPDATES',
    'SPLITS',
    'AttentionMeanFactory',
    'Centres',
    'ClientData',
    'ClientReport',
    'ClientState',
    'GlobalCentres',
    'GlobalComponents',
    'HpflDataError',
    'RoundSpec',
    'ServerState',
    'SiloPredictions',
    'batch_type',
    'build_baseline',
    'build_distributed',
    'build_fedatt',
    'build_fedavg',
    'build_fednoise',
    'build_fedprox',
    'build_fedsgd',
    'build_hpfl',
    'build_method',
    'build_process',
    'client_data',
    'client_data_type',
    'client_round',
    'client_state_type',
    'federated_data',
    'finalize_metrics',
    'global_components',
    'global_embedding',
    'gradient_round',
    'initial_client_state',
    'initial_client_states',
    'kmeans',
    'lloyd_step',
    'local_training',
    'maximin_init',
    'metric_sums',
    'personalize_embeddings',
    'personalize_public',
    'predict_silos',
    'public_aggregation_weights',
    'round_spec',
    'split_dataset',
    'validation_statistics',
]
