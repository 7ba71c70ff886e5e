"""Who is calling: request-signature verification, replay protection and roles.

Verification order (each failure is a 401 with its own code): headers present (missing_signature),
timestamp within the skew window (clock_skew), key known (unknown_access_key) and enabled
(disabled_access_key), signature equal in constant time (bad_signature), nonce not seen in the window
(replayed_nonce; nonces live in the database so the check holds across restarts and API replicas).

The API verifies through ``BatchVerifier``: the requests waiting at one moment share one write
transaction (group commit). Each still gets its answer only after its nonce is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from dlcloud import signing
from dlcloud.errors import DlcloudError, PermissionDenied
from dlcloud.schemas.users import Role
from dlcloud.services.secrets import SecretBox
from dlcloud.store import nonces as nonce_store
from dlcloud.store import tenants as tenant_store
from dlcloud.store.db import Database
from dlcloud.store.rows import utcnow

NONCE_RE = re.compile(r"^[A-Za-z0-9_\-]{16,128}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
KEY_ID_RE = re.compile(r"^AK[A-Z0-9]{18}$")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Caller:
    """The authenticated principal of one request."""

    tenant_id: str
    tenant: str
    user_id: str
    user: str
    role: Role
    access_key: str

    @property
    def is_platform_admin(self) -> bool:
        return self.role == Role.PLATFORM_ADMIN

    @property
    def is_tenant_admin(self) -> bool:
        return self.role in (Role.PLATFORM_ADMIN, Role.TENANT_ADMIN)

    def require_platform_admin(self, what: str) -> None:
        if not self.is_platform_admin:
            raise PermissionDenied(f"{what} needs the platform-admin role; you are {self.role.value}")

    def require_tenant_admin(self, what: str) -> None:
        if not self.is_tenant_admin:
            raise PermissionDenied(f"{what} needs the tenant-admin or platform-admin role; you are {self.role.value}")

    def require_owner_or_admin(self, kind: str, owner_id: str, name: str, action: str) -> None:
        """PermissionDenied unless the caller owns the ``kind`` (a job, a study) or is one of its tenant's admins."""
        if owner_id != self.user_id and not self.is_tenant_admin:
            raise PermissionDenied(f"only the {kind}'s owner or a tenant admin can {action} {kind} {name!r}")


class AuthError(DlcloudError):
    """A 401; ``access_key`` is kept for the audit log when one was given."""

    def __init__(self, message: str, code: str, access_key: str | None = None):
        super().__init__(message, code=code)
        self.access_key = access_key


@dataclass(frozen=True)
class SignedRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names
    body_sha256: str | None  # computed by the server; None when the body is streamed (declared hash used)


@dataclass(frozen=True)
class CheckedRequest:
    """A request that passed every check needing no database; what remains needs the key."""

    key_id: str
    nonce: str
    signature: str
    canonical: str


def verify(db: Database, box: SecretBox, skew_seconds: int, req: SignedRequest) -> Caller:
    """Verify one request in a write transaction of its own (``BatchVerifier`` shares one between requests)."""
    outcome = _verify_alone(db, box, check_request(skew_seconds, req))
    if isinstance(outcome, AuthError):
        raise outcome
    return outcome


def check_request(skew_seconds: int, req: SignedRequest) -> CheckedRequest:
    """The checks before the key is looked up, in the documented order; raises AuthError."""
    h = req.headers
    key_id = h.get(signing.HEADER_KEY.lower())
    ts = h.get(signing.HEADER_TIMESTAMP.lower())
    nonce = h.get(signing.HEADER_NONCE.lower())
    sig = h.get(signing.HEADER_SIGNATURE.lower())
    declared = h.get(signing.HEADER_CONTENT_SHA256.lower())
    missing = [
        name
        for name, value in (
            (signing.HEADER_KEY, key_id),
            (signing.HEADER_TIMESTAMP, ts),
            (signing.HEADER_NONCE, nonce),
            (signing.HEADER_SIGNATURE, sig),
        )
        if not value
    ]
    if missing:
        raise AuthError(
            f"request is not signed: missing header(s) {', '.join(missing)}; see docs/api-auth.md",
            "missing_signature",
            key_id,
        )
    assert key_id and ts and nonce and sig
    if not KEY_ID_RE.match(key_id):
        # never echo or record it: a client that swapped its key and secret would leak the secret
        raise AuthError(
            "access key id is malformed: expected AK followed by 18 letters or digits", "unknown_access_key"
        )
    if not NONCE_RE.match(nonce):
        raise AuthError("nonce must be 16-128 characters of A-Z a-z 0-9 _ -", "bad_signature", key_id)
    try:
        ts_int = int(ts)
    except ValueError:
        raise AuthError(f"{signing.HEADER_TIMESTAMP} must be integer Unix seconds", "clock_skew", key_id) from None
    now = time.time()
    if abs(now - ts_int) > skew_seconds:
        raise AuthError(
            f"request timestamp is {int(ts_int - now)} s away from server time; at most {skew_seconds} s allowed",
            "clock_skew",
            key_id,
        )
    body_hash = req.body_sha256
    if body_hash is None:
        if not declared or not SHA256_RE.match(declared):
            raise AuthError(
                f"streamed uploads must declare {signing.HEADER_CONTENT_SHA256} (hex SHA-256 of the body)",
                "bad_signature",
                key_id,
            )
        body_hash = declared
    elif declared is not None and declared != body_hash:
        raise AuthError(f"{signing.HEADER_CONTENT_SHA256} does not match the body", "bad_signature", key_id)
    canonical = signing.canonical_request(req.method, req.path, req.query, body_hash, ts, nonce, key_id)

    return CheckedRequest(key_id, nonce, sig, canonical)


def _verify_in_transaction(conn: Connection, box: SecretBox, reqs: list[CheckedRequest]) -> list[Caller | AuthError]:
    """Key known and enabled, signature, then the nonce, for requests sharing one write transaction.

    Each request gets its Caller or its AuthError (returned, not raised: one bad request must not roll
    back the nonces of the others). The keys are read in the write transaction that records the nonces,
    so a key disabled before the commit authenticates nothing. Core, not the ORM, and a fixed number of
    statements per transaction (one per distinct key, one to find used nonces, one insert): this runs
    for every request. Raises IntegrityError when a concurrent writer (another API process on
    PostgreSQL) recorded one of the nonces after the check; see ``_verify_alone``.
    """
    keys: dict[str, tuple[tenant_store.KeyOwner | None, str | None]] = {}  # key id -> (key, secret)
    outcomes: list[Caller | AuthError] = []
    for req in reqs:
        key_id = req.key_id
        if key_id not in keys:
            owner = tenant_store.get_key_owner(conn, key_id)
            keys[key_id] = (owner, box.decrypt(owner.secret_encrypted) if owner is not None and owner.enabled else None)
        key, secret = keys[key_id]
        if key is None:
            outcomes.append(AuthError(f"unknown access key {key_id}", "unknown_access_key", key_id))
        elif not key.enabled or secret is None:
            outcomes.append(AuthError(f"access key {key_id} is disabled", "disabled_access_key", key_id))
        elif not signing.signatures_equal(signing.sign(secret, req.canonical), req.signature):
            outcomes.append(
                AuthError(
                    "signature does not match the request; check the secret key and the canonical request "
                    "(docs/api-auth.md)",
                    "bad_signature",
                    key_id,
                )
            )
        else:
            outcomes.append(Caller(key.tenant_id, key.tenant, key.user_id, key.user, Role(key.role), key_id))
    signed = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, Caller)]
    if not signed:
        return outcomes
    seen = nonce_store.used(conn, list({reqs[i].key_id for i in signed}), [reqs[i].nonce for i in signed])
    now = utcnow()
    rows = []
    for i in signed:
        pair = (reqs[i].key_id, reqs[i].nonce)
        if pair in seen:  # stored before, or earlier in this batch
            outcomes[i] = AuthError("nonce was already used: replayed request", "replayed_nonce", pair[0])
        else:
            seen.add(pair)
            rows.append({"access_key": pair[0], "nonce": pair[1], "seen_at": now})
    if rows:
        nonce_store.add(conn, rows)
    return outcomes


def _verify_alone(db: Database, box: SecretBox, req: CheckedRequest) -> Caller | AuthError:
    """One request in a write transaction of its own."""
    try:
        with db.write_connection() as conn:
            return _verify_in_transaction(conn, box, [req])[0]
    except IntegrityError:  # another process recorded this nonce between our check and our insert
        return AuthError("nonce was already used: replayed request", "replayed_nonce", req.key_id)


_Waiter = tuple[CheckedRequest, asyncio.AbstractEventLoop, "asyncio.Future[Caller]"]


class BatchVerifier:
    """Verifies signed requests for the event loop; the requests waiting at one moment share ONE transaction.

    Group commit: ``verify`` runs the checks that need no database at once, then the request waits while
    a single writer thread takes every waiting request and, in one write transaction, looks up their
    keys, compares each signature in constant time and records the nonces of the valid ones. After the
    commit each request gets its Caller or its AuthError. So a response still leaves only after its nonce
    is committed, and a key disabled before that commit authenticates nothing, exactly as with
    ``verify``; but a request costs a share of one transaction instead of a thread-pool hop plus a write
    transaction of its own (SQLite admits one writer at a time, so those queued behind each other).

    The thread starts with the first request and ends after ``IDLE_SECONDS`` without one.
    """

    MAX_BATCH = 256
    IDLE_SECONDS = 1.0

    def __init__(self, db: Database, box: SecretBox, skew_seconds: int) -> None:
        self._db = db
        self._box = box
        self._skew = skew_seconds
        self._cond = threading.Condition()
        self._waiting: list[_Waiter] = []
        self._running = False

    async def verify(self, req: SignedRequest) -> Caller:
        checked = check_request(self._skew, req)  # fails fast, before the database
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Caller] = loop.create_future()
        with self._cond:
            self._waiting.append((checked, loop, future))
            if self._running:
                self._cond.notify()
            else:
                self._running = True
                threading.Thread(target=self._run, name="dlcloud-auth", daemon=True).start()
        return await future

    def _run(self) -> None:
        batch: list[_Waiter] = []
        try:
            while batch := self._take():
                self._settle(batch, self._verify_batch(batch))
        except BaseException as exc:  # a bug here must not leave requests waiting forever
            log.exception("the authentication thread failed")
            self._settle(batch, [exc] * len(batch))
            raise
        finally:
            with self._cond:
                if self._running:  # failed rather than idle: what waits gets a new thread
                    self._running = bool(self._waiting)
                    if self._running:
                        threading.Thread(target=self._run, name="dlcloud-auth", daemon=True).start()

    def _take(self) -> list[_Waiter]:
        """The next batch; empty (and the thread marked stopped) after ``IDLE_SECONDS`` without requests."""
        with self._cond:
            if not self._waiting:
                self._cond.wait(self.IDLE_SECONDS)
                if not self._waiting:
                    self._running = False
                    return []
            batch = self._waiting[: self.MAX_BATCH]
            del self._waiting[: self.MAX_BATCH]
            return batch

    def _verify_batch(self, batch: list[_Waiter]) -> list[Caller | BaseException]:
        reqs = [checked for checked, _, _ in batch]
        try:
            try:
                with self._db.write_connection() as conn:
                    return list(_verify_in_transaction(conn, self._box, reqs))
            except IntegrityError:  # a concurrent writer stored one of the nonces: find which, one at a time
                return [_verify_alone(self._db, self._box, req) for req in reqs]
        except Exception as exc:  # the database failed, so does every request of the batch (a 500 each)
            log.exception("the authentication transaction of %d request(s) failed", len(batch))
            failures: list[Caller | BaseException] = []
            for _ in batch:
                failure = RuntimeError("the authentication transaction failed")
                failure.__cause__ = exc  # one exception object per request: tracebacks stay apart
                failures.append(failure)
            return failures

    @staticmethod
    def _settle(batch: list[_Waiter], outcomes: list[Caller | BaseException]) -> None:
        """Hand each outcome to its request's event loop: one callback per loop, not per request."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Caller], Caller | BaseException]]]
        by_loop = {}
        for (_, loop, future), outcome in zip(batch, outcomes, strict=True):
            by_loop.setdefault(loop, []).append((future, outcome))
        for loop, results in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_resolve, results)


def _resolve(results: list[tuple[asyncio.Future[Caller], Caller | BaseException]]) -> None:
    for future, outcome in results:
        if future.done():  # cancelled: the client went away
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def purge_nonces(db: Database, skew_seconds: int) -> int:
    """Forget nonces older than twice the skew window (timestamps that old are rejected anyway)."""
    cutoff = utcnow() - timedelta(seconds=2 * skew_seconds)
    with db.write() as s:
        return nonce_store.purge(s, cutoff)
