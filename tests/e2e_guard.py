"""The fast lane's guard: a test not marked ``e2e`` may start no process and no server.

``scripts/test.sh --fast`` runs ``pytest -m "not e2e"``; tests/conftest.py then calls :func:`install`,
which makes these raise :class:`StartsSomething`, naming the test:

* a process: ``subprocess.Popen`` (``subprocess.run``, ``check_output``), ``asyncio.create_subprocess_*``,
  ``os.system``, ``os.fork``, ``os.posix_spawn``;
* a server: ``socket.socket.bind`` and ``listen`` (TCP, UDP and AF_UNIX alike: asyncio, aiohttp,
  grpclib and http.server all bind through it; a TCP bind to port 0 is let through, as urllib3's IPv6
  probe at import makes one, and its ``listen`` is not), ``grpc.server`` and ``grpc.aio.server``
  (grpcio's core binds in C);
* the fake NVML library: loading ``libnvidia-ml.so*`` (a build cached by an earlier run compiles
  nothing, but the first run of the lane would start gcc).

Allowed: ``socket.socketpair`` (asyncio's self-pipe), client sockets, threads, in-memory doubles.
A violation is also recorded, so a test whose code swallows the exception still fails at teardown.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import subprocess
from collections.abc import Callable
from typing import Any

_violations: list[str] = []


class StartsSomething(RuntimeError):
    """A test outside the e2e marker started a process or a server."""


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "collection").rsplit(" (", 1)[0]


def refuse(what: str) -> None:
    """Record and raise: ``what`` is "starts a process (...)", "starts a server (...)"."""
    message = f"{_current_test()} {what}: mark it e2e (pytest.mark.e2e, docs/testing.md)"
    _violations.append(message)
    raise StartsSomething(message)


def take_violations() -> list[str]:
    """The violations since the last call (the conftest fixture fails the test with them)."""
    out = list(_violations)
    _violations.clear()
    return out


def _wrap(owner: Any, name: str, what: Callable[..., str | None]) -> None:
    """Replace ``owner.name`` by a function that refuses when ``what(*args)`` says what it would start."""
    original = getattr(owner, name)

    def guarded(*args: Any, **kwargs: Any) -> Any:
        said = what(*args, **kwargs)
        if said:
            refuse(said)
        return original(*args, **kwargs)

    guarded.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(owner, name, guarded)


def _argv(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    cmd = kwargs.get("args", args[0] if args else "?")
    return str(cmd if isinstance(cmd, str) else " ".join(map(str, cmd))[:80])


def _probe(sock: socket.socket, addr: Any) -> bool:
    """A TCP bind to port 0 alone serves nothing (urllib3 probes IPv6 so at import); its listen() is refused."""
    return (sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM
            and isinstance(addr, tuple) and len(addr) > 1 and addr[1] == 0)


def install() -> None:
    """Put the guard in place for the rest of the session (the fast lane only)."""
    _wrap(subprocess.Popen, "__init__", lambda _self, *a, **kw: f"starts a process ({_argv(a, kw)})")
    _wrap(asyncio, "create_subprocess_exec", lambda *a, **kw: f"starts a process ({_argv(a, kw)})")
    _wrap(asyncio, "create_subprocess_shell", lambda *a, **kw: f"starts a process ({_argv(a, kw)})")
    _wrap(os, "system", lambda *a, **kw: f"starts a process ({_argv(a, kw)})")
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
        _wrap(os, name, lambda *a, _n=name, **kw: f"starts a process (os.{_n})")
    _wrap(socket.socket, "bind",
          lambda self, addr, *a: None if _probe(self, addr) else f"starts a server (binds {addr!r})")
    _wrap(socket.socket, "listen", lambda _self, *a: "starts a server (listens)")
    _wrap(ctypes.CDLL, "__init__", lambda _self, name, *a, **kw: (
        "loads the fake NVML library (gcc builds it)"
        if name and os.path.basename(str(name)).startswith("libnvidia-ml") else None))
    try:
        import grpc
        import grpc.aio
    except ImportError:
        return
    _wrap(grpc, "server", lambda *a, **kw: "starts a server (grpc.server)")
    _wrap(grpc.aio, "server", lambda *a, **kw: "starts a server (grpc.aio.server)")
