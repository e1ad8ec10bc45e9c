"""Ports for the jobs the tests start.

A port found free by binding port 0 comes from the kernel's ephemeral range, the range
every gloo connection of every other job running meanwhile takes its local ports from:
between the test's look and the job's bind one of them may take it (EADDRINUSE, a job
that never starts).  These ports come from below that range, where nothing is assigned
on its own.
"""

from __future__ import annotations

import random
import socket

#: ports tried: below Linux's default ephemeral range (32768-60999), above the well-known
LOW, HIGH = 20000, 32000


def free_port() -> int:
    """A TCP port of 127.0.0.1 outside the ephemeral range that was free a moment ago."""
    for _ in range(200):
        port = random.randrange(LOW, HIGH)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {LOW}-{HIGH}")
