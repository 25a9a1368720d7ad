"""Per-client private state kept between rounds (e.g. FURL's user embeddings), keyed by client id.

`InMemoryClientStateStore` keeps the states in a dict; `SqliteClientStateStore`
keeps them in a durable SQLite file. Both validate every value against a spec,
return `default_fn(client_id)` for clients never stored, and version writes so
that a resumed run can `rollback` to the round of its server checkpoint (see
`fedpersonal.client_state.store`). numpy and the standard library only.
"""

from fedpersonal.client_state.in_memory import InMemoryClientStateStore
from fedpersonal.client_state.sqlite_store import SqliteClientStateStore
from fedpersonal.client_state.store import ClientStateStore
from fedpersonal.client_state.store import CorruptStateError
from fedpersonal.client_state.store import DefaultFn
from fedpersonal.client_state.store import Spec
from fedpersonal.client_state.store import State
from fedpersonal.client_state.store import seeded_uniform_default
from fedpersonal.client_state.store import spec_of
from fedpersonal.client_state.store import zeros_default
