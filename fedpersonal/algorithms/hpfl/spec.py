"""`RoundSpec`: what one round of an HPFL-family process does, as data (see `fedpersonal.algorithms.hpfl.process`).

HPFL, its ablations and every baseline are values of it (`fedpersonal.algorithms.hpfl.baselines.round_spec` names
them); `process.build_process(config, spec)` builds the process a value describes.
"""

from __future__ import annotations

import dataclasses

from fedpersonal.algorithms.hpfl.types import CENTER_WEIGHTINGS

STARTS = ('own', 'global')
LOCAL_UPDATES = ('epochs', 'gradient')
PUBLIC_AGGREGATIONS = ('none', 'accuracy_weighted', 'mean', 'attention')
PRIVATE_AGGREGATIONS = ('none', 'clustered')
UPDATE_AGGREGATIONS = ('mean', 'attention')


@dataclasses.dataclass(frozen=True)
class RoundSpec:
    """What one round does (see the module docstring); HPFL, its ablations and every baseline are values of it.

    Attributes:
      start: What the client trains from: ``'own'`` model or the broadcast ``'global'`` public components.
      local_update: ``'epochs'`` of local optimizer steps or FedSGD's one ``'gradient'`` pass.
      proximal_strength: FedProx's mu of the local objective (0: no proximal term).
      upload_noise_stddev: Fednoise's standard deviation of the noise added to every uploaded coordinate.
      public_aggregation: One of `PUBLIC_AGGREGATIONS`.
      private_aggregation: One of `PRIVATE_AGGREGATIONS`.
      accuracy_threshold: HPFL's p of ``d(Acc_ki, p)`` (accuracy-weighted aggregation).
      center_weighting: Weighting of the global centres in the fine-grained update, one of `CENTER_WEIGHTINGS`.
      server_learning_rate: Learning rate of the default server optimizer (SGD) of update aggregations.
    """

    start: str = 'own'
    local_update: str = 'epochs'
    proximal_strength: float = 0.0
    upload_noise_stddev: float = 0.0
    public_aggregation: str = 'none'
    private_aggregation: str = 'none'
    accuracy_threshold: float = 0.5
    center_weighting: str = 'distance'
    server_learning_rate: float = 1.0

    def __post_init__(self):
        for name, allowed in (
            ('start', STARTS),
            ('local_update', LOCAL_UPDATES),
            ('public_aggregation', PUBLIC_AGGREGATIONS),
            ('private_aggregation', PRIVATE_AGGREGATIONS),
            ('center_weighting', CENTER_WEIGHTINGS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f'{name} must be one of {allowed}, got {getattr(self, name)!r}.')
        for name in ('proximal_strength', 'upload_noise_stddev', 'server_learning_rate'):
            if not getattr(self, name) >= 0:
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)}.')
        if not 0.0 <= self.accuracy_threshold < 1.0:
            raise ValueError(f'accuracy_threshold must be in [0, 1), got {self.accuracy_threshold}.')
        if (self.start == 'global') != self.updates_public:
            raise ValueError(
                f"start='global' goes with an update aggregation {UPDATE_AGGREGATIONS} (the update is "
                f"global - trained) and start='own' with the others, got start={self.start!r}, "
                f'public_aggregation={self.public_aggregation!r}.'
            )
        if self.start == 'global' and self.private_aggregation != 'none':
            raise ValueError("private_aggregation='clustered' needs start='own' (HPFL).")
        if self.start == 'own' and (
            self.local_update != 'epochs' or self.proximal_strength or self.upload_noise_stddev
        ):
            raise ValueError(
                "local_update='gradient', proximal_strength and upload_noise_stddev act on the "
                "update to a broadcast model: they need start='global'."
            )

    @property
    def updates_public(self) -> bool:
        """Clients upload updates to the broadcast public components (the FedAvg family)."""
        return self.public_aggregation in UPDATE_AGGREGATIONS

    @property
    def personalizes(self) -> bool:
        """There is a client step after aggregation."""
        return self.public_aggregation != 'none' or self.private_aggregation != 'none'
