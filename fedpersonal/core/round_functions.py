"""`RoundFunctions`: a stateful composed round as the pure TF functions its TFF computations wrap.

An algorithm whose process `compose_personalized_process` builds from its own distributor, `ServerStep` and
`PostAggregation` (HPFL) states its round once, as these functions: its TFF computations wrap them (the
per-client backend, `process.next`), and a backend that runs each client's work as one compiled program in the
driver (`fedpersonal.simulation.silo_engine`, chosen by `fedpersonal.backends`) calls the same functions, with the
server step applied to the clients' uploads stacked along a first axis. The process state is the composer's
`tff.learning.templates.LearningAlgorithmState`: ``distributor`` and ``aggregator`` hold the distributor's and the
server step's states.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple


class RoundFunctions(NamedTuple):
    """A round as TF functions (see the module docstring); the state arguments are the process state's fields.

    Attributes:
      distribute: ``(distributor state, global weights) -> (what each client receives, new distributor state)``.
      client_update: ``(received, client data, private state, noise) -> (uploads, client metrics, new private
        state)``: the client work the process's client computation wraps (with ``noise=None``: drawn inside).
      client_noise: ``(received, client data) -> noise``: the random numbers `client_update` draws, computed
        outside XLA (whose stateless random numbers differ from TF's) and passed in; None when it draws none.
      server_step: ``(server step state, global weights, uploads, client metrics) -> (new global weights, new
        state, measurements)``, the uploads and metrics stacked over the clients: the process's `ServerStep` with
        TFF's default aggregators, as one TF function.
      metric_sums: ``client metrics -> additive sums``.
      finalize_metrics: ``summed sums -> the round's client_work metrics``.
      post_aggregation: The `PostAggregation` as ``(server_value, client_update)`` TF functions (`server_value`
        of the new global weights and server step state), or None.
      shrink: ``(client data, private state, rows) -> (client data, private state)``: the client's inputs cut to
        the table rows it uses, ``rows(count, capacity)`` giving how many to keep; None: nothing to cut.
      restore: ``(full private state, trained cut state) -> private state``: the rows `shrink` cut, put back.
      dataset_repeats: How often `client_update` iterates each dataset field of the client data (others: once).
      aggregators: The `tff.aggregators` factories the server step applies, by argument name (None: TFF's
        default); a backend emulating the defaults refuses others.
      not_compilable: Why `client_update` cannot be compiled with XLA (e.g. an op without an XLA kernel), or None.
    """

    distribute: Callable[[Any, Any], tuple[Any, Any]]
    client_update: Callable[..., tuple[Any, Any, Any]]
    client_noise: Callable[[Any, Any], Any] | None
    server_step: Callable[..., tuple[Any, Any, Any]]
    metric_sums: Callable[[Any], Any]
    finalize_metrics: Callable[[Any], Any]
    post_aggregation: tuple[Callable[[Any, Any], Any], Callable[[Any, Any, Any], Any]] | None = None
    shrink: Callable[..., tuple[Any, Any]] | None = None
    restore: Callable[[Any, Any], Any] | None = None
    dataset_repeats: Mapping[str, int] = {}
    aggregators: Mapping[str, Any] = {}
    not_compilable: str | None = None
