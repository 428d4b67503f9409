import pytest

from tests.gpusim.fixtures import gpusim_factory, gpusim_lib  # noqa: F401
from tests.shrreg import helpers
from tests.sim.fixtures import api_server  # noqa: F401


@pytest.fixture(scope="session")
def mkregion():
    """Build tests/shrreg/build/mkregion once per session (make is a no-op when up to date)."""
    return helpers.build()


@pytest.fixture
def region_dir(tmp_path):
    root = tmp_path / "containers"
    root.mkdir()
    return root


@pytest.fixture
def procs():
    """Long-running helper processes started by a test; killed and reaped afterwards."""
    started = []
    yield started
    for p in started:
        helpers.stop(p)
