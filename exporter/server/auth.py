"""HTTP basic authentication against bcrypt hashes, fair under a flood of wrong passwords.

* A known-good credential never waits: the cache of verified credentials (a hash of user and password)
  is asked first, and each success through it renews the entry, so a scraper that keeps succeeding is
  never checked with bcrypt again (the users are read once at start: a cached credential stays right).
* bcrypt work is bounded: :data:`BCRYPT_SLOTS` checks at once, :data:`MAX_WAITING` waiting, one per
  client address in flight or waiting. Beyond that a request is refused at once (429 with
  ``Retry-After``), counted, never queued: a flood from one address costs one core at most.
* Fair per client: waiters go in the order of their address's strikes (wrong credentials and refused
  checks since its last success), then of arrival, and a full waiting room gives a waiter's place to
  a client with fewer, so a scraper arriving with a credential not yet cached waits about one bcrypt,
  not behind the flood.
* A wrong credential is remembered a while too (bounded), so repeating it costs no bcrypt.
* An unknown user name is checked against a dummy hash of the same cost as the highest of the configured
  hashes, so a wrong user name takes as long as a wrong password.

:func:`lookup` and :func:`admit` are the pure decisions; :class:`BasicAuth` does the waiting and the bcrypt.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import itertools
import os
import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from exporter.server.wire import Request, Response

AUTH_CACHE_SECONDS = 60.0  # a verified credential is remembered this long after its last success
AUTH_CACHE_MAX = 64
DENIED_CACHE_SECONDS = 60.0  # a refused credential, this long (no bcrypt for it meanwhile)
DENIED_CACHE_MAX = 1024
BCRYPT_SLOTS = 2  # checks at once: at most 2 cores' worth
MAX_WAITING = 16  # checks waiting for a slot; at cost 12 (~0.25 s) the last waits about 2 s
MAX_CLIENTS = 4096  # client addresses whose strikes are remembered
RESULTS = ("cached", "verified", "wrong", "busy")  # kube_gpu_exporter_http_auth_total{result}
_COST = re.compile(rb"\$2[aby]\$(\d\d)\$")


def lookup(good: Mapping[bytes, float], denied: Mapping[bytes, float], key: bytes, now: float) -> str:
    """What the caches say of credential ``key``: "good", "denied" or "unknown" (bcrypt decides)."""
    if good.get(key, 0.0) > now:
        return "good"
    if denied.get(key, 0.0) > now:
        return "denied"
    return "unknown"


@dataclass(frozen=True, slots=True, order=True)
class Waiter:
    """A check waiting for a bcrypt slot; fewer strikes of its client go first, then arrival."""

    strikes: int  # the client address's wrong credentials and refused checks since its last success
    seq: int
    client: str


def admit(running: int, waiting: Collection[Waiter], busy: Collection[str], new: Waiter,
          slots: int = BCRYPT_SLOTS, max_waiting: int = MAX_WAITING) -> tuple[str, Waiter | None]:
    """Whether ``new`` may "run" now, must "wait", takes the place of the returned waiter ("evict"), or is
    "refused" at once (its client has a check already, or the room is full of clients no worse than it)."""
    if new.client in busy:
        return "refused", None
    if running < slots and not waiting:
        return "run", None
    if len(waiting) < max_waiting:
        return "wait", None
    worst = max(waiting)
    if new.strikes < worst.strikes:  # a client that keeps failing or asking gives way to one that does not
        return "evict", worst
    return "refused", None


def _remember(cache: dict[bytes, float], key: bytes, until: float, now: float, most: int) -> None:
    if key not in cache and len(cache) >= most:
        for k in [k for k, t in cache.items() if t <= now]:
            del cache[k]
        if len(cache) >= most:
            cache.clear()
    cache[key] = until


def dummy_hash(hashes: Mapping[str, bytes]) -> bytes:
    """A hash of a random password at the highest cost of ``hashes``: what an unknown user is checked against."""
    import bcrypt  # only with basic_auth_users

    cost = max((int(m.group(1)) for h in hashes.values() if (m := _COST.match(h))), default=10)
    return bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(cost))


class BasicAuth:
    """See the module docstring; runs on the event loop thread (bcrypt in a worker thread)."""

    def __init__(self, users: Mapping[str, bytes], clock: Callable[[], float] = time.monotonic,
                 ttl: float = AUTH_CACHE_SECONDS) -> None:
        self.users, self._clock, self._ttl = dict(users), clock, ttl
        self._good: dict[bytes, float] = {}  # sha256 of "user\0password" -> expiry
        self._denied: dict[bytes, float] = {}
        self._running = 0
        self._waiting: dict[Waiter, asyncio.Future[bool]] = {}
        self._busy: set[str] = set()  # client addresses with a check running or waiting
        self._strikes: dict[str, int] = {}  # client address -> wrong credentials and refusals since its last success
        self._seq = itertools.count()
        self._dummy = dummy_hash(self.users)
        self.checks = 0  # bcrypt verifications made
        self.results = dict.fromkeys(RESULTS, 0)

    def _decode(self, header: str | None) -> tuple[str, bytes] | None:
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            raw = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = raw.partition(b":")
        if not sep:
            return None
        return user.decode("utf-8", "replace"), password

    async def verdict(self, header: str | None, client: str = "?") -> str:
        """One of :data:`RESULTS` for the ``Authorization`` header (malformed: "wrong", no bcrypt)."""
        result = await self._verdict(header, client)
        self.results[result] += 1
        return result

    async def allowed(self, header: str | None, client: str = "?") -> bool:
        """Whether the header names a user with its password (a refused check is not allowed)."""
        return await self.verdict(header, client) in ("cached", "verified")

    async def _verdict(self, header: str | None, client: str) -> str:
        creds = self._decode(header)
        if creds is None:
            return "wrong"
        user, password = creds
        key = hashlib.sha256(user.encode() + b"\0" + password).digest()
        now = self._clock()
        seen = lookup(self._good, self._denied, key, now)
        if seen == "good":
            self._good[key] = now + self._ttl  # renewed while it keeps succeeding
            return "cached"
        if seen == "denied":
            return "wrong"
        if not await self._acquire(client):
            return "busy"
        try:
            hashed = self.users.get(user)
            self.checks += 1
            ok = await asyncio.to_thread(_check, password, hashed or self._dummy)
        finally:
            self._release(client)
        now = self._clock()
        if ok and user in self.users:
            _remember(self._good, key, now + self._ttl, now, AUTH_CACHE_MAX)
            self._strikes.pop(client, None)
            return "verified"
        _remember(self._denied, key, now + DENIED_CACHE_SECONDS, now, DENIED_CACHE_MAX)
        self._strike(client)
        return "wrong"

    def _strike(self, client: str) -> None:
        if client not in self._strikes and len(self._strikes) >= MAX_CLIENTS:
            self._strikes.clear()  # bounded; forgetting only makes clients equal again
        self._strikes[client] = self._strikes.get(client, 0) + 1

    async def _acquire(self, client: str) -> bool:
        """A bcrypt slot for ``client`` (waiting for it when :func:`admit` says so); False: refused."""
        new = Waiter(self._strikes.get(client, 0), next(self._seq), client)
        decision, victim = admit(self._running, self._waiting, self._busy, new)
        if decision == "refused":
            self._strike(client)  # one that keeps asking goes behind one that asks once
            return False
        if victim is not None:
            self._busy.discard(victim.client)
            if not (evicted := self._waiting.pop(victim)).done():  # done: cancelled, its task cleans up
                evicted.set_result(False)
        self._busy.add(client)
        if decision == "run":
            self._running += 1
            return True
        slot = self._waiting[new] = asyncio.get_running_loop().create_future()
        try:
            return await slot
        except asyncio.CancelledError:  # the connection went away while it waited
            if slot.done() and not slot.cancelled() and slot.result():
                self._release(client)  # handed a slot meanwhile: hand it on
            else:
                self._waiting.pop(new, None)
                self._busy.discard(client)
            raise

    def _release(self, client: str) -> None:
        self._busy.discard(client)
        self._running -= 1
        while self._waiting:
            slot = self._waiting.pop(min(self._waiting))
            if not slot.done():  # done: its connection went away (cancelled), the next one gets the slot
                self._running += 1
                slot.set_result(True)
                return

    async def check(self, request: Request) -> Response | None:
        """Every path, as node_exporter: 401 with ``WWW-Authenticate: Basic`` without valid credentials,
        429 with ``Retry-After`` when the check could not be made now."""
        result = await self.verdict(request.header("authorization"), request.remote)
        if result == "busy":
            return Response.text(429, "429 Too Many Requests: too many password checks at once\n",
                                 headers=[("Retry-After", "1")])
        if result == "wrong":
            return Response.text(401, "401 Unauthorized\n", headers=[("WWW-Authenticate", "Basic")])
        return None


def _check(password: bytes, hashed: bytes) -> bool:
    try:
        import bcrypt  # only with basic_auth_users

        return bcrypt.checkpw(password, hashed)  # constant-time comparison of the hashes
    except ValueError:
        return False
