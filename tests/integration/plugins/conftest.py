from tests.sim.fixtures import api_server  # noqa: F401
from tests.unit.plugins.collection_path import install

install()
