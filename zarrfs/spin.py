"""How long a waiter polls before it sleeps: shared by the request loop and the Redis link,
which both spin briefly for an answer that usually comes within microseconds."""

from __future__ import annotations


def next_window(window: float, gap: float, longest: float) -> float:
    """How long to poll before sleeping next time, for a waiter that polls for up to ``window``
    seconds (the request loop for the next request, a Redis link for a reply). ``gap`` is
    how long the last wait took in all: within ``longest``, polling would have caught it and
    the window is full again; a longer one halves it, down to nothing, so a peer that answers
    slowly or now and then does not keep the waiter spinning."""
    if gap <= longest:
        return longest
    return window / 2 if window > 2e-6 else 0.0
