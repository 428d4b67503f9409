from tests.sim.fixtures import api_server  # noqa: F401
