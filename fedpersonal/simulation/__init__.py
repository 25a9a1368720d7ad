"""Fast simulation: a round's logical clients as one compiled program per group (the default engine).

* `functional`: a partially local Keras model as a pure function of its weights;
* `packing`: clients' datasets as fixed-shape, masked group tensors (`ClientPacker`);
* `lockstep`: the local optimizer loop of a whole group in lockstep (vectorized over clients, XLA-compiled);
* `group`: a group's pre-aggregated `ClientResult` (per-client weights, non-finite zeroing) and the checks of
  what a group can pre-aggregate;
* `silo_engine`: cross-silo rounds (HPFL) from their `fedpersonal.core.RoundFunctions`, each client one compiled
  program in the driver.
* `round_backend`: `EngineBackend`, an engine process's `fedpersonal.core.RoundBackend` (its packer and round
  runner: what `process.run_round` runs).

`plan_engine` composes these into the group client work of a `fedpersonal.core.client_plan.ClientPlan` (FedRecon,
FedAvg, FURL, Ditto, FedPer, ...; FedDVA and HPFL still compose their own); one TFF client slot then carries a
group of logical clients, and TFF's weighted mean over the groups equals its weighted mean over the logical clients.
"""

from fedpersonal.simulation import functional
from fedpersonal.simulation import group
from fedpersonal.simulation import lockstep
from fedpersonal.simulation import packing
from fedpersonal.simulation.options import SIMULATIONS
from fedpersonal.simulation.options import check_simulation
from fedpersonal.simulation.options import default_group_size

__all__ = [
    'SIMULATIONS',
    'check_simulation',
    'default_group_size',
    'functional',
    'group',
    'lockstep',
    'packing',
]
