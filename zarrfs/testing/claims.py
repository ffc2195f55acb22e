"""What a driver claims: the tests of a conformance kit it cannot pass by its nature (a
read-only archive cannot remove a key; a store of Zarr v3 keys only cannot hold any name) are
skipped with the reason it gives, instead of failing.

A kit's subclass lists them in :attr:`Claims.cannot`, ``{test name: reason}``; a test named
there is skipped with ``"<driver>: <reason>"``; every other test runs, and must pass.
"""

from __future__ import annotations

import pytest


class Claims:
    """Mixed into the conformance kits: skips the tests a driver declares it cannot pass."""

    #: ``{test name (without parameters): why the driver cannot pass it}``.
    cannot: dict[str, str] = {}

    @pytest.fixture(autouse=True)
    def _claims(self, request: pytest.FixtureRequest) -> None:
        name = getattr(request.node, "originalname", None) or request.node.name
        reason = self.cannot.get(name)
        if reason is not None:
            pytest.skip(f"{type(self).__name__}: {reason}")


__all__ = ["Claims"]
