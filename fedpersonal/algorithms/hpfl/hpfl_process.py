"""`HpflProcess`: the process object every builder of the HPFL family returns (`process.build_process`)."""

from __future__ import annotations

from typing import Any

from fedpersonal.algorithms.hpfl import data as data_lib
from fedpersonal.algorithms.hpfl.spec import RoundSpec
from fedpersonal.algorithms.hpfl.types import ClientState
from fedpersonal.algorithms.hpfl.types import HpflState
from fedpersonal.core import process as process_lib
from fedpersonal.models import gum


class HpflProcess(process_lib.PersonalizedProcess):
    """A process of the HPFL family: a `PersonalizedProcess` plus its configuration and building blocks.

    Attributes:
      config: The `gum.GumConfig`.
      spec: The `RoundSpec`.
      name: The method's name.
      client_data_type, client_state_type: TFF types of a `ClientData` and a `ClientState` (= `private_state_type`).
      client_train: TF computation of the client work: ``(ClientData, ClientState) -> (ClientState, ClientReport)``
        (start ``'own'``) or ``(ClientData, ClientState, ModelWeights, round_num) -> (ClientState, ClientReport,
        ClientResult)`` (start ``'global'``).
      client_centres: TF computation ``ClientState -> Centres`` (None without clustered private aggregation).
      client_update: TF computation ``(GlobalComponents, ClientState, ClientReport) -> ClientState``, the client
        step after aggregation (None without one).
      round_from_uploads: Federated computation ``(HpflState@S, {ClientState}@C, {ClientReport}@C, {uploads}@C) ->
        ProcessOutput``: everything after the client work (``next`` = client work, then this), where the uploads
        are the `Centres` (start ``'own'``; unused without clustering) or the `ClientResult`s (start ``'global'``).
      public_aggregation: Federated computation ``(PublicWeights@S, {PublicWeights}@C, {[K]}@C, {[K]}@C) ->
        PublicWeights@S``: the accuracy-weighted formula (previous global, client c_i, Acc_i, I_i), the same code
        `next` runs (None without accuracy-weighted aggregation).
    """

    def __init__(
        self,
        initialize_fn,
        next_fn,
        *,
        config: gum.GumConfig,
        spec: RoundSpec,
        name: str,
        public_seed: int,
        parts: dict[str, Any],
        packer: Any = None,
        round_runner: Any = None,
    ):
        state_type = parts['client_state_type']
        super().__init__(
            initialize_fn,
            next_fn,
            get_model_weights=lambda state: state.global_model_weights,
            global_weights_type=initialize_fn.type_signature.result.member.global_model_weights,
            private_state_type=state_type,
            initial_private_state_fn=lambda: self.initial_client_state(0, 0),
            parts=parts,
            packer=packer,
            round_runner=round_runner,
        )
        self.config = config
        self.spec = spec
        self.name = name
        self.public_seed = public_seed
        self.client_data_type = parts['client_data_type']
        self.client_state_type = state_type
        self.client_train = parts['client_train']
        self.client_centres = parts.get('client_centres')
        self.client_update = parts.get('client_update')
        self.round_from_uploads = parts['round_from_uploads']
        self.public_aggregation = parts.get('public_aggregation')

    def initial_client_state(self, num_users: int, num_items: int, *, private_seed: int = 0) -> ClientState:
        """A client's first state (public part equal to the initial global public components).

        `initial_private_state()` is the state of an empty silo (0 users and items): a template of the structure.
        """
        return data_lib.initial_client_state(
            self.config, num_users, num_items, public_seed=self.public_seed, private_seed=private_seed
        )

    def get_public_weights(self, state: HpflState) -> gum.PublicWeights:
        """The global public components in `state`."""
        return gum.PublicWeights(*state.global_model_weights.trainable)
