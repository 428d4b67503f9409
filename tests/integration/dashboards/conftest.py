from tests.gpusim.fixtures import gpusim_factory, gpusim_lib  # noqa: F401
from tests.sim.fixtures import api_server  # noqa: F401
