"""The kubelet's device-plugin registration server and its per-plugin gRPC clients.

Model of kubernetes ``pkg/kubelet/cm/devicemanager/plugin/v1beta1/``:

* ``server.go`` ``Register``: version and resource-name checks, then *synchronously* ``connectClient``;
* ``handler.go`` ``connectClient`` / ``runClient``: clients are kept **by resource name only**. When a
  client's ListAndWatch stream ends, ``runClient`` disconnects *whatever client is now registered under
  that name* -- if the plugin re-registered in the meantime, that is the new one (kubernetes #121994,
  #127803; fixed upstream only by PR #135437, 2026). Disconnecting marks every device of the resource
  Unhealthy and stops the endpoint; the kubelet never reconnects by itself, the plugin must register again;
* ``client.go`` ``Connect`` (dial with a 10 s ``WithBlock`` timeout, then ``GetDevicePluginOptions`` with
  no deadline), ``Run`` (ListAndWatch with no deadline), ``Disconnect``.

Test seams, both off by default: ``stream_end_delay_s`` makes the kubelet notice late that a plugin
ended a stream (a busy kubelet: the window of the race above; an end the kubelet caused itself it sees
at once), ``drop_stream()`` breaks a client's connection from the kubelet side (a transport error).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from tests.sim.kubelet.klog import KlogWriter, go_quote, go_quote_list, rpc_error_text

SUPPORTED_VERSIONS = ("v1beta1",)
KUBELET_SOCKET = "kubelet.sock"
DIAL_TIMEOUT_S = 10.0  # plugin/v1beta1/client.go dial()

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_extended_resource_name(name: str) -> bool:
    """``v1helper.IsExtendedResourceName``: domain-prefixed, not ``*kubernetes.io/``, and
    ``requests.<name>`` a qualified name (DNS subdomain prefix, name part <= 63 characters)."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    parts = f"requests.{name}".split("/")
    if len(parts) != 2:
        return False
    prefix, short = parts
    return (
        0 < len(prefix) <= 253
        and bool(_DNS1123_SUBDOMAIN.match(prefix))
        and 0 < len(short) <= 63
        and bool(_QUALIFIED_NAME.match(short))
    )


class ConnectError(Exception):
    pass


class ClientHandler(Protocol):
    """What the device manager offers the clients (``ClientHandler`` in plugin/v1beta1/api.go)."""

    def plugin_connected(self, resource: str, client: PluginClient) -> None: ...
    def plugin_disconnected(self, resource: str) -> None: ...
    def plugin_list_and_watch_receiver(self, resource: str, resp: Any) -> None: ...
    def cleanup_plugin_directory(self, directory: str) -> None: ...


class PluginClient:
    """``plugin/v1beta1/client.go``: one gRPC connection to one registered plugin."""

    def __init__(
        self,
        resource: str,
        socket: str,
        handler: ClientHandler,
        log: KlogWriter,
        dial_timeout_s: float,
        alive: Callable[[], bool],
    ) -> None:
        self.resource = resource
        self.socket = socket
        self.handler = handler
        self.log = log
        self.dial_timeout_s = dial_timeout_s
        self.alive = alive
        self.channel: grpc.Channel | None = None
        self.api: Any = None
        self.closed_by_kubelet = False  # the kubelet itself ended the connection (it sees that at once)
        self._lock = threading.Lock()

    def connect(self) -> None:
        channel = grpc.insecure_channel(f"unix://{self.socket}")
        try:
            grpc.channel_ready_future(channel).result(timeout=self.dial_timeout_s)
        except grpc.FutureTimeoutError:
            channel.close()
            err = "failed to dial device plugin: context deadline exceeded"
            self.log.error_s(
                "client.go:71",
                "Unable to connect to device plugin client with socket path",
                err,
                path=self.socket,
            )
            raise ConnectError(err) from None
        with self._lock:
            self.channel = channel
            self.api = api_pb2_grpc.DevicePluginStub(channel)
        self.handler.plugin_connected(self.resource, self)

    def run(self) -> None:
        err = "EOF"  # what Recv() returns when the plugin ends the stream cleanly
        try:
            for resp in self.api.ListAndWatch(api_pb2.Empty()):  # context.Background(): no deadline
                if not self.alive():
                    return
                self.log.log(
                    2,
                    "client.go:91",
                    "State pushed for device plugin",
                    resource=self.resource,
                    resourceCapacity=len(resp.devices),
                )
                self.handler.plugin_list_and_watch_receiver(self.resource, resp)
        except (grpc.RpcError, ValueError) as exc:  # ValueError: our own channel was closed meanwhile
            err = (
                rpc_error_text(exc)
                if isinstance(exc, grpc.RpcError)
                else ("rpc error: code = Canceled desc = grpc: the client connection is closing")
            )
        if self.alive():
            self.log.error_s(
                "client.go:86",
                "ListAndWatch ended unexpectedly for device plugin",
                err,
                resource=self.resource,
            )

    def close_connection(self) -> threading.Thread | None:
        """Close the gRPC connection aside (closing waits for the stream's reader thread)."""
        with self._lock:
            channel, self.channel = self.channel, None
            self.closed_by_kubelet = True
        if channel is None:
            return None
        closer = threading.Thread(target=channel.close, name=f"close-{self.resource}", daemon=True)
        closer.start()
        return closer

    def disconnect(self) -> None:
        self.close_connection()
        self.handler.plugin_disconnected(self.resource)
        self.log.log(2, "client.go:117", "Device plugin disconnected", resource=self.resource)


class RegistrationServer(api_pb2_grpc.RegistrationServicer):
    """``plugin/v1beta1/server.go`` + ``handler.go``; one instance per kubelet process."""

    def __init__(
        self,
        root: str,
        handler: ClientHandler,
        log: KlogWriter,
        *,
        supported_versions: tuple[str, ...] = SUPPORTED_VERSIONS,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        stream_end_delay_s: float = 0.0,
    ) -> None:
        self.root = root
        self.handler = handler
        self.log = log
        self.supported_versions = supported_versions
        self.dial_timeout_s = dial_timeout_s
        self.stream_end_delay_s = stream_end_delay_s
        self.clients: dict[str, PluginClient] = {}
        self.registrations: list[str] = []  # resource names, in order of successful Register calls
        self.alive = False
        self._mutex = threading.Lock()
        self._grpc: grpc.Server | None = None

    @property
    def socket_path(self) -> str:
        return os.path.join(self.root, KUBELET_SOCKET)

    # ---------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.log.log(2, "server.go:97", "Starting device plugin registration server")
        os.makedirs(self.root, exist_ok=True)
        self.handler.cleanup_plugin_directory(self.root)
        server = grpc.server(cf.ThreadPoolExecutor(max_workers=8, thread_name_prefix="sim-kubelet-reg"))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._grpc = server
        self.alive = True

    def kill(self) -> list[threading.Thread]:
        """The kubelet process exits: every connection drops at once, nothing more is handled."""
        self.alive = False
        server, self._grpc = self._grpc, None
        if server is not None:
            server.stop(0).wait(2)
        with self._mutex:
            clients = list(self.clients.values())
            self.clients.clear()
        closers = [c for c in (client.close_connection() for client in clients) if c is not None]
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        return closers

    # ---------------------------------------------------------------------------------- Register
    def Register(self, request, context):  # noqa: N802 - gRPC method name
        name = request.resource_name
        self.log.log(
            0, "server.go:143", "Got registration request from device plugin with resource", resourceName=name
        )
        if request.version not in self.supported_versions:
            err = (
                f"requested API version {go_quote(request.version)} is not supported by kubelet. "
                f"Supported version is {go_quote_list(self.supported_versions)}"
            )
            self.log.error_s(
                "server.go:148",
                "Bad registration request from device plugin with resource",
                err,
                resourceName=name,
            )
            context.abort(grpc.StatusCode.UNKNOWN, err)
        if not is_extended_resource_name(name):
            err = f"the ResourceName {go_quote(name)} is invalid"
            self.log.error_s("server.go:154", "Bad registration request from device plugin", err)
            context.abort(grpc.StatusCode.UNKNOWN, err)
        try:
            self._connect_client(name, os.path.join(self.root, request.endpoint))
        except ConnectError as exc:
            self.log.error_s("server.go:159", "Error connecting to device plugin client", exc)
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        with self._mutex:
            self.registrations.append(name)
        return api_pb2.Empty()

    # ---------------------------------------------------------------------------------- clients
    def _connect_client(self, name: str, socket: str) -> None:
        client = PluginClient(name, socket, self.handler, self.log, self.dial_timeout_s, lambda: self.alive)
        self._register_client(name, client)
        try:
            client.connect()
        except ConnectError as exc:
            self._deregister_client(name)
            self.log.error_s("handler.go:83", "Failed to connect to new client", exc, resource=name)
            raise
        self.log.log(2, "handler.go:87", "Connected to new client", resource=name)
        threading.Thread(
            target=self._run_client, args=(name, client), name=f"sim-kubelet-lw-{name}", daemon=True
        ).start()

    def _run_client(self, name: str, client: PluginClient) -> None:
        client.run()
        if not self.alive:
            return
        if self.stream_end_delay_s > 0 and not client.closed_by_kubelet:
            time.sleep(self.stream_end_delay_s)  # test seam: a busy kubelet notices the plugin's end late
        current = self.get_client(name)  # by NAME: possibly a newer registration's client
        if current is None or not self.alive:
            return
        self.disconnect_client(name, current)

    def disconnect_client(self, name: str, client: PluginClient) -> None:
        self._deregister_client(name)
        client.disconnect()

    def get_client(self, name: str) -> PluginClient | None:
        with self._mutex:
            return self.clients.get(name)

    def _register_client(self, name: str, client: PluginClient) -> None:
        with self._mutex:
            self.clients[name] = client
        self.log.log(2, "handler.go:107", "Registered client", name=name)

    def _deregister_client(self, name: str) -> None:
        with self._mutex:
            self.clients.pop(name, None)
        self.log.log(2, "handler.go:115", "Deregistered client", name=name)

    def drop_stream(self, name: str) -> bool:
        """Test seam: the connection to ``name``'s current client breaks (kubelet side)."""
        client = self.get_client(name)
        return client is not None and client.close_connection() is not None
