"""pytest fixtures for the simulated Kubernetes API server.

Import in a conftest: ``from tests.sim.fixtures import api_server  # noqa: F401``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sim.apiserver import ApiServer


@pytest.fixture
def api_server() -> Iterator[ApiServer]:
    """A fresh simulated API server per test (starts in a few ms), stopped afterwards."""
    server = ApiServer()
    server.start()
    try:
        yield server
    finally:
        server.close()
