"""`SqliteClientStateStore`: a durable on-disk client state store (stdlib `sqlite3`, WAL mode).

Schema (one SQLite file):

* `meta(key PRIMARY KEY, value)`: `format` (schema version), `spec` (canonical
  JSON of the spec, byte order included), `committed_round`, `num_clients`
  (the clients in `states`, maintained in the transaction of every write, so
  `len()` never counts rows).
* `states(client_id PRIMARY KEY, round, blob) WITHOUT ROWID`: each registered
  client's committed value and the round that wrote it (0: `register`).
* `pending(client_id, round, blob, PRIMARY KEY (client_id, round)) WITHOUT ROWID`:
  written by earlier versions of this store (uncommitted writes); emptied when
  such a file is opened, as a resume would discard them.

A blob is a state's arrays' raw C-order bytes concatenated in spec order; its
length is checked on every read (`CorruptStateError` names the client).

Writes since the last commit (`put`) stay in this process's memory, each
client's latest only, until `commit` writes them to `states` in one durable
transaction: a round costs no disk writes, only a checkpoint does (Ditto's
personal copies on MovieLens, 943 x 336 KB, took 7-13 s a round to write to the
file every round). A killed process loses them, which costs nothing: a run
resumes from its last checkpoint, whose round is the committed one, and would
discard them anyway (`rollback`). Operations:

* `get(ids)`: the pending writes, then indexed `IN (...)` lookups in `states`:
  O(k log N) for k clients among N.
* `put(ids, states, r)`: an indexed lookup of which ids are new, then memory.
* `commit(r)`: one transaction writes the P pending values over their clients'
  rows in `states` (garbage-collecting the superseded ones), updates
  `num_clients` and records `committed_round = r`: O(P log N). Runs with
  `synchronous=FULL`, so a commit also survives power loss; `register` uses
  `synchronous=NORMAL` in WAL mode (it survives a killed process, and the file
  stays consistent on power loss).
* `rollback(r)`: drops the pending writes of rounds > r, in memory.
* `register`: streams the (id, blob) rows into one `executemany` `INSERT` (memory
  stays flat for millions of clients), then truncates the WAL.

Opening an existing file with a different spec raises ValueError. One store
object per file at a time (committed round and client count are cached).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from fedpersonal import faults
from fedpersonal.client_state import store as store_lib

_FORMAT = 1
_CHUNK = 500  # Host parameters per `IN (...)` query (SQLite allows 32766).
_SCHEMA = (
    'CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID',
    'CREATE TABLE states (client_id TEXT PRIMARY KEY, round INTEGER NOT NULL, blob BLOB NOT NULL) WITHOUT ROWID',
    'CREATE TABLE pending (client_id TEXT NOT NULL, round INTEGER NOT NULL, blob BLOB NOT NULL, '
    'PRIMARY KEY (client_id, round)) WITHOUT ROWID',
)


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


def _placeholders(n: int) -> str:
    return ','.join('?' * n)


class SqliteClientStateStore(store_lib.ClientStateStore):
    """Client states in an SQLite file, with the commit/rollback semantics of `ClientStateStore`."""

    def __init__(
        self,
        path: str | os.PathLike,
        spec: Iterable[tuple[Sequence[int], Any]],
        default_fn: store_lib.DefaultFn,
        *,
        cache_mb: int = 16,
    ):
        """Opens the store at `path`, creating it if the file does not exist or is empty.

        Args:
          path: The SQLite file (its directory must exist); `-wal` and `-shm`
            files appear beside it while it is open.
          spec: `(shape, dtype)` of each array of a state; must equal the spec the
            file was created with.
          default_fn: `client_id -> State` for clients never stored.
          cache_mb: SQLite page cache size of the connection, in MiB.

        Raises:
          ValueError: If the file is a store with another spec or format, or an
            SQLite database that is not a client state store.
        """
        super().__init__(spec, default_fn)
        self.path = os.fspath(path)
        self._conn: sqlite3.Connection | None = None
        self._pending = store_lib.PendingWrites()
        conn = sqlite3.connect(self.path, isolation_level=None)  # Transactions are explicit.
        try:
            conn.execute('PRAGMA journal_mode=WAL')
            conn.execute('PRAGMA synchronous=NORMAL')
            conn.execute('PRAGMA journal_size_limit=67108864')  # Truncate the WAL to 64 MiB after checkpoints.
            conn.execute(f'PRAGMA cache_size={-1024 * int(cache_mb)}')
            self._conn = conn
            self._open_or_create()
        except BaseException:
            self._conn = None
            conn.close()
            raise

    # ------------------------------------------------------------------------------------------- internals

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ValueError(f'the client state store {self.path} is closed')
        return self._conn

    def _write(self, body, *, durable: bool = False):
        """Runs `body(conn)` in one write transaction (fsynced when `durable`); returns its result."""
        conn = self._db()
        if durable:
            conn.execute('PRAGMA synchronous=FULL')
        try:
            conn.execute('BEGIN IMMEDIATE')
            try:
                result = body(conn)
                conn.execute('COMMIT')
            except BaseException:
                conn.execute('ROLLBACK')
                raise
        finally:
            if durable:
                conn.execute('PRAGMA synchronous=NORMAL')
        return result

    def _open_or_create(self) -> None:
        spec_json = store_lib.spec_to_json(self.spec)

        def body(conn: sqlite3.Connection) -> dict[str, Any]:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.executemany(
                    'INSERT INTO meta (key, value) VALUES (?, ?)',
                    [('format', _FORMAT), ('spec', spec_json), ('committed_round', 0), ('num_clients', 0)],
                )
            elif not {'meta', 'states', 'pending'} <= tables:
                raise ValueError(
                    f'{self.path} is an SQLite database but not a client state store (tables: {sorted(tables)})'
                )
            return dict(conn.execute('SELECT key, value FROM meta'))

        meta = self._write(body)
        if meta.get('format') != _FORMAT:
            raise ValueError(
                f'{self.path}: client state store format {meta.get("format")!r} is not supported '
                f'(this code reads format {_FORMAT})'
            )
        if meta['spec'] != spec_json:
            stored = store_lib.normalize_spec((e['shape'], e['dtype']) for e in json.loads(meta['spec']))
            raise ValueError(
                f'{self.path}: the client state store was created with spec '
                f'{store_lib.format_spec(stored)} but is opened with spec '
                f'{store_lib.format_spec(self.spec)}'
            )
        self._committed_round = int(meta['committed_round'])
        self._num_clients = int(meta['num_clients'])
        if self._db().execute('SELECT 1 FROM pending LIMIT 1').fetchone() is not None:  # From an earlier version.

            def discard(conn: sqlite3.Connection) -> int:
                conn.execute('DELETE FROM pending')
                (count,) = conn.execute('SELECT COUNT(*) FROM states').fetchone()
                conn.execute("UPDATE meta SET value = ? WHERE key = 'num_clients'", (count,))
                return count

            self._num_clients = self._write(discard, durable=True)

    def _blobs(self, conn: sqlite3.Connection, client_ids: Sequence[str]) -> dict[str, bytes]:
        """The committed blob of each client in `states` among distinct `client_ids`."""
        blobs: dict[str, bytes] = {}
        for chunk in _chunks(client_ids):
            blobs.update(
                conn.execute(
                    f'SELECT client_id, blob FROM states WHERE client_id IN ({_placeholders(len(chunk))})', chunk
                )
            )
        return blobs

    def _existing(self, conn: sqlite3.Connection, client_ids: Sequence[str]) -> set[str]:
        """The clients in `states` among `client_ids`."""
        found: set[str] = set()
        for chunk in _chunks(client_ids):
            found.update(
                row[0]
                for row in conn.execute(
                    f'SELECT client_id FROM states WHERE client_id IN ({_placeholders(len(chunk))})', chunk
                )
            )
        return found

    # ------------------------------------------------------------------------------------------------- API

    def get(self, client_ids: Sequence[str]) -> list[store_lib.State]:
        conn = self._db()
        client_ids = [store_lib.check_client_id(cid) for cid in client_ids]
        unwritten = [cid for cid in dict.fromkeys(client_ids) if cid not in self._pending]
        conn.execute('BEGIN')  # One consistent snapshot.
        try:
            blobs = self._blobs(conn, unwritten)
        finally:
            conn.execute('COMMIT')
        blobs.update((cid, blob) for cid in client_ids if (blob := self._pending.blob(cid)) is not None)
        return [self._codec.decode(cid, blobs[cid]) if cid in blobs else self._default(cid) for cid in client_ids]

    def contains(self, client_id: str) -> bool:
        conn = self._db()
        client_id = store_lib.check_client_id(client_id)
        return client_id in self._pending or (
            conn.execute('SELECT 1 FROM states WHERE client_id = ?', (client_id,)).fetchone() is not None
        )

    def __len__(self) -> int:
        self._db()
        return self._num_clients + self._pending.new_clients

    def put(self, client_ids: Sequence[str], states: Sequence[store_lib.State], round_num: int) -> None:
        conn = self._db()
        round_num = store_lib.check_round(round_num, self._committed_round, 'put')
        client_ids = [store_lib.check_client_id(cid) for cid in client_ids]
        if len(client_ids) != len(states):
            raise ValueError(f'put: {len(client_ids)} client ids but {len(states)} states')
        store_lib.check_distinct(client_ids, 'put')
        blobs = [self._codec.encode(cid, state) for cid, state in zip(client_ids, states)]  # Validate all first.
        self._pending.put(client_ids, blobs, round_num, lambda ids: self._existing(conn, ids))

    def register(self, client_ids: Sequence[str], states: Sequence[store_lib.State] | None = None) -> None:
        conn = self._db()
        if states is not None and len(client_ids) != len(states):
            raise ValueError(f'register: {len(client_ids)} client ids but {len(states)} states')
        pairs = ((cid, None) for cid in client_ids) if states is None else zip(client_ids, states)
        last_id: str | None = None  # Id of the row being inserted.
        num_rows = 0  # Rows yielded.

        def rows() -> Iterator[tuple[str, bytes]]:
            nonlocal last_id, num_rows
            for cid, state in pairs:
                store_lib.check_client_id(cid)
                if cid in self._pending:
                    raise ValueError(f'register: client {cid!r} is already registered')
                blob = self._codec.encode(cid, self.default_fn(cid) if state is None else state)
                last_id = cid
                num_rows += 1
                yield cid, blob

        def body(conn: sqlite3.Connection) -> int:
            try:
                conn.executemany('INSERT INTO states (client_id, round, blob) VALUES (?, 0, ?)', rows())
            except sqlite3.IntegrityError as e:
                raise ValueError(f'register: client {last_id!r} is already registered or listed more than once') from e
            conn.execute("UPDATE meta SET value = value + ? WHERE key = 'num_clients'", (num_rows,))
            return num_rows

        self._num_clients += self._write(body, durable=True)
        conn.execute('PRAGMA wal_checkpoint(TRUNCATE)')

    def commit(self, round_num: int) -> None:
        self._db()
        round_num = store_lib.check_round(round_num, self._committed_round, 'commit')
        self._pending.check(round_num, self._committed_round, 'commit')
        count = len(self)
        rows = self._pending.writes()

        def body(conn: sqlite3.Connection) -> None:
            conn.executemany('INSERT OR REPLACE INTO states (client_id, round, blob) VALUES (?, ?, ?)', rows)
            conn.execute("UPDATE meta SET value = ? WHERE key = 'committed_round'", (round_num,))
            conn.execute("UPDATE meta SET value = ? WHERE key = 'num_clients'", (count,))
            faults.point('client_state_commit')  # Killed here: the transaction is rolled back by SQLite.

        self._write(body, durable=True)
        self._num_clients = count
        self._pending.clear()
        self._committed_round = round_num

    def rollback(self, round_num: int) -> None:
        conn = self._db()
        round_num = store_lib.check_round(round_num, self._committed_round, 'rollback')
        self._pending.check(round_num, self._committed_round, 'rollback')
        self._pending.drop_after(round_num, lambda ids: self._existing(conn, ids))

    def committed_round(self) -> int:
        self._db()
        return self._committed_round

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            self._pending = store_lib.PendingWrites()  # Uncommitted writes do not outlive the store (module doc).
            conn.close()
