"""Wrong passwords from many connections and addresses, in a process of its own (tests/test_auth_fairness.py).

``python -m tests.auth_flood PORT SECONDS CONNECTIONS ADDRESSES`` sends ``GET /metrics`` with a new wrong
password on each connection, from 127.0.0.2 onwards, as fast as the server answers, for SECONDS; then prints
the answers by status as one JSON line (-1: no answer). A process of its own: its work does not compete with
the server under test for one interpreter's lock, as an attacker on the network would not.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time


async def attacker(port: int, n: int, addresses: int, until: float, answers: dict[int, int]) -> None:
    source, i = f"127.0.0.{2 + n % addresses}", 0
    while time.monotonic() < until:
        i += 1
        token = base64.b64encode(f"prometheus:guess-{n}-{i}".encode()).decode()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
            writer.write(f"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Basic {token}"
                         "\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.read(64), 30)
            status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else 0
            answers[status] = answers.get(status, 0) + 1
            writer.close()
        except (TimeoutError, OSError, ValueError, IndexError):
            answers[-1] = answers.get(-1, 0) + 1
            await asyncio.sleep(0.05)


async def main(port: int, seconds: float, connections: int, addresses: int) -> dict[int, int]:
    answers: dict[int, int] = {}
    until = time.monotonic() + seconds
    await asyncio.gather(*(attacker(port, n, addresses, until, answers) for n in range(connections)))
    return answers


if __name__ == "__main__":
    port, seconds, connections, addresses = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(asyncio.run(main(port, seconds, connections, addresses))), flush=True)
