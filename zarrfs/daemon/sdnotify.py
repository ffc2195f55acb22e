"""systemd's readiness protocol (``Type=notify``), without a dependency: one datagram to the
socket ``$NOTIFY_SOCKET`` names (a path, or ``@name`` for an abstract socket) per state change,
``READY=1`` once the mount serves and ``STOPPING=1`` when it ends. Nothing is sent when the
variable is unset (not started by systemd), and a socket that is gone is no error."""

from __future__ import annotations

import os
import socket


def notify(*states: str) -> bool:
    """Send ``states`` (``"READY=1"``, ``"STATUS=..."``, ``"MAINPID=N"``) to systemd; whether
    they were sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or not states:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(states).encode())
    except OSError:
        return False
    return True
