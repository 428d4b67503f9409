"""grpcaio: synchronous servicers on a grpc.aio server keep the synchronous server's semantics the kubelet
plugins rely on (a cancelled stream runs its callbacks at once and its generator's ``finally``; ``abort``
answers the status)."""

import threading

import grpc
import pytest

from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_agent.kubeletplugin import SocketServer


class _Servicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.closed = threading.Event()
        self.unary_callback = threading.Event()

    def GetDevicePluginOptions(self, request, context):  # noqa: N802
        context.add_callback(self.unary_callback.set)
        return api_pb2.DevicePluginOptions(pre_start_required=True)

    def Allocate(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no such device")

    def ListAndWatch(self, request, context):  # noqa: N802
        context.add_callback(self.cancelled.set)
        try:
            while context.is_active():
                yield api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID="gpu-0", health="Healthy")])
                self.cancelled.wait(30.0)  # only the cancel's callback ends this wait in time
        finally:
            self.closed.set()


@pytest.fixture
def served(tmp_path):
    servicer = _Servicer()
    server = SocketServer(str(tmp_path / "p.sock"),
                          lambda s: api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, s), 2, "t")
    server.start()
    channel = grpc.insecure_channel(f"unix://{server.path}")
    yield servicer, api_pb2_grpc.DevicePluginStub(channel), server
    channel.close()
    server.stop()


def test_unary_answers_and_runs_callbacks(served):
    servicer, stub, server = served
    assert stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5).pre_start_required
    assert servicer.unary_callback.wait(5)
    assert server.socket_ok()


def test_abort_answers_its_status(served):
    _, stub, _ = served
    with pytest.raises(grpc.RpcError) as err:
        stub.Allocate(api_pb2.AllocateRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.details() == "no such device"


def test_cancelled_stream_wakes_and_closes_the_generator(served):
    servicer, stub, _ = served
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=30)
    assert next(stream).devices[0].ID == "gpu-0"
    stream.cancel()
    assert servicer.cancelled.wait(5), "the kubelet's cancel must reach the servicer at once"
    assert servicer.closed.wait(5), "the generator's finally must run (ListAndWatch reports a lost stream)"


def test_stop_ends_a_stream_and_removes_the_socket(served, tmp_path):
    servicer, stub, server = served
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=30)
    next(stream)
    server.stop()
    assert servicer.closed.wait(5)
    assert not (tmp_path / "p.sock").exists()


def test_the_poller_outlives_the_last_server(tmp_path):
    """grpc.aio shuts its poller down when the last server is freed, in the freeing thread, under the loop
    that reads the poller's socket (EBADF in ``PollerCompletionQueue._handle_events`` on a SIGTERM or a
    restart). The loop holds grpc.aio for the process's life: the poller thread stays, a new server works."""
    import gc
    import time

    def pollers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if "_poll_wrapper" in t.name]

    servicer = _Servicer()
    for round_ in range(2):
        server = SocketServer(str(tmp_path / f"p{round_}.sock"),
                              lambda s: api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, s), 2, "t")
        server.start()
        channel = grpc.insecure_channel(f"unix://{server.path}")
        assert api_pb2_grpc.DevicePluginStub(channel).GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
        channel.close()
        server.stop()
        del server
        gc.collect()  # the aio server is freed here, in this thread, as the plugin's main thread frees it
        time.sleep(0.3)
        assert pollers(), "grpc.aio's poller was shut down with the last server"
