"""The core every algorithm is built on: one process protocol, one composer, one client-work library.

* `process`: `PersonalizedProcess` and `ProcessOutput`, the protocol of every algorithm, and `RoundBackend`,
  what runs its rounds (`PerClientBackend`: TFF's `next`; the simulation engine implements another).
* `compose`: `compose_personalized_process`, TFF's broadcast / aggregator / finalizer around an algorithm's
  client work, optionally with a server step of its own (`ServerStep`) and a client step after aggregation
  (`PostAggregation`).
* `round_functions`: `RoundFunctions`, a composed round as the pure TF functions its computations wrap, for a
  backend that runs each client as one compiled program (HPFL's silos).
* `client_work`: the client-side steps (local optimizer loops, reconstruction, proximal terms, metrics,
  weights, evaluation passes), written once.
* `array_data`: `ArrayDatasets`, clients' data given as arrays (the engine reads their batches without a
  tf.data pipeline).
* `tff_names`: TFF 0.87's argument names (``client_optimizer_fn``, ...) as aliases of the builders' own, shared
  by the reconstruction builders and their evaluations.
* `input_checks` and `non_finite`: what `PersonalizedProcess.run_round` refuses instead of returning silent
  numbers (labels outside the model's outputs; a NaN or infinite loss, `NonFiniteLossError`).

See docs/ARCHITECTURE.md for the data flow of a round and how to add an algorithm.
"""

from fedpersonal.core import client_work
from fedpersonal.core.array_data import ArrayDatasets
from fedpersonal.core.compose import PostAggregation
from fedpersonal.core.compose import ServerStep
from fedpersonal.core.compose import compose_personalized_process
from fedpersonal.core.compose import keras_metrics
from fedpersonal.core.compose import ratio_metrics
from fedpersonal.core.compose import weighted_aggregator
from fedpersonal.core.process import PerClientBackend
from fedpersonal.core.process import PersonalizedProcess
from fedpersonal.core.process import ProcessOutput
from fedpersonal.core.process import RoundBackend
from fedpersonal.core.process import from_learning_process
from fedpersonal.core.round_functions import RoundFunctions

__all__ = [
    'ArrayDatasets',
    'PerClientBackend',
    'PersonalizedProcess',
    'PostAggregation',
    'ProcessOutput',
    'RoundBackend',
    'RoundFunctions',
    'ServerStep',
    'client_work',
    'compose_personalized_process',
    'from_learning_process',
    'keras_metrics',
    'ratio_metrics',
    'weighted_aggregator',
]
