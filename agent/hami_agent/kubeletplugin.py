"""What the agent's kubelet plugins share, written once: the device plugin (``deviceplugin``) and the DRA
driver (``dra``) each serve gRPC on unix sockets the kubelet dials.

* ``DeadlineRunner``: an RPC body runs on a bounded pool with its own budget and the caller waits at most the
  deadline, so a hung NVML or API call can never block the kubelet (the failure of seed 003);
* ``SocketServer``: one gRPC server on one unix socket, restartable, that notices when its socket file is
  gone or replaced (the kubelet wipes its plugin directories when it restarts); served by ``grpc.aio`` on one
  loop thread (``grpcaio``: an idle synchronous server costs ~0.6 ms/s of CPU per socket, issue 31): the
  deadline-bound unary methods are ``async`` and hand their bodies from the loop to the runner, the
  streams and the registration service are synchronous methods on the socket's own pool;
* ``RegistrationServicer``: the plugin watcher's ``Registration`` service (``GetInfo`` and
  ``NotifyRegistrationStatus``; kubernetes ``pkg/kubelet/pluginmanager``);
* ``run_rpc``: an RPC body under the runner, awaited on the gRPC loop, its errors turned into the gRPC status
  the kubelet shows, its duration and error code counted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from hami_agent import grpcaio, log
from hami_agent.deviceplugin.api import pluginregistration_pb2 as reg_pb2
from hami_agent.deviceplugin.api import pluginregistration_pb2_grpc as reg_pb2_grpc
from hami_agent.deviceplugin.budget import RpcBudget

logger = logging.getLogger(__name__)
T = TypeVar("T")


class DeadlineExceeded(RuntimeError):
    pass


class DeadlineRunner:
    """Runs RPC bodies on a bounded pool, each with its own ``RpcBudget``; callers wait at most
    ``deadline_s``. The body is ``fn(budget)``; its success must go through ``budget.commit`` when it
    writes anything (Allocate), or simply be returned (read-only bodies)."""

    def __init__(self, workers: int, deadline_s: float, *, reply_margin_s: float = 0.1,
                 commit_margin_s: float = 0.25, api_timeout_s: float | None = None) -> None:
        self.deadline_s = deadline_s
        self.reply_margin_s = reply_margin_s
        self.commit_margin_s = commit_margin_s
        self.api_timeout_s = api_timeout_s
        self._pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc-body")

    def budget(self, what: str) -> RpcBudget:
        return RpcBudget(what, self.deadline_s, reply_margin_s=self.reply_margin_s,
                         commit_margin_s=self.commit_margin_s, api_timeout_s=self.api_timeout_s)

    def run(self, fn: Callable[[RpcBudget], T], what: str) -> T:
        """``fn`` on the pool, waited for from this thread (blocking)."""
        budget: RpcBudget[T] = self.budget(what)
        fut = self._pool.submit(fn, budget)
        done, _ = cf.wait([fut], timeout=max(0.0, budget.remaining()))
        if not done:
            return self._past_deadline(budget, fut, what)
        try:
            return fut.result()
        except BaseException:
            committed, result = self._committed_anyway(budget, what)
            if committed:
                return result  # type: ignore[return-value]
            raise

    async def run_async(self, fn: Callable[[RpcBudget], T], what: str) -> T:
        """``fn`` on the pool, awaited from the gRPC loop: the call's thread hands the body straight to the
        pool and is woken once, when it ends (issue 31: one hand-off per RPC less than ``run`` from a
        thread of its own)."""
        budget: RpcBudget[T] = self.budget(what)
        fut = self._pool.submit(fn, budget)
        waited = asyncio.wrap_future(fut)
        try:
            done, _ = await asyncio.wait([waited], timeout=max(0.0, budget.remaining()))
        except asyncio.CancelledError:  # the caller left: nobody hears a success, so none may be written
            budget.answer_error()
            waited.cancel()
            raise
        if not done:
            waited.cancel()  # a late end is dropped, never logged as an unretrieved exception
            return self._past_deadline(budget, fut, what)
        try:
            return waited.result()
        except BaseException:
            committed, result = self._committed_anyway(budget, what)
            if committed:
                return result  # type: ignore[return-value]
            raise

    def _past_deadline(self, budget: RpcBudget[T], fut: cf.Future, what: str) -> T:
        committed, result = budget.answer_error()
        if committed:  # the success write won the race: it is the truth, answer it
            log.v(logger, 3, "%s committed at its deadline; answering the committed success", what)
            return result  # type: ignore[return-value]
        fut.cancel()  # no effect once running; a queued body is dropped
        raise DeadlineExceeded(f"{what} did not finish within the {self.deadline_s:g}s deadline; failing "
                               "fast instead of blocking the kubelet (see hami-agent device-plugin logs)")

    @staticmethod
    def _committed_anyway(budget: RpcBudget[T], what: str) -> tuple[bool, T | None]:
        """The body raised: ``(True, result)`` when its success was committed all the same (answer it)."""
        committed, result = budget.answer_error()
        if committed:  # only a bug after the commit can get here; the success was written
            logger.exception("%s raised after its success was committed; answering the success", what)
        return committed, result

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class SocketServer:
    """One gRPC server on one unix socket, restartable, that notices when its socket file is gone."""

    def __init__(self, path: str, add: Callable[[Any], None], workers: int, name: str) -> None:
        """``add(server)``: the generated ``add_*Servicer_to_server`` calls (synchronous servicers)."""
        self.path = path
        self.add = add
        self.workers = workers
        self.name = name
        self._server: grpc.aio.Server | None = None
        self._executor: cf.ThreadPoolExecutor | None = None
        self._inode: tuple[int, int] | None = None

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        if os.path.lexists(self.path):
            os.unlink(self.path)  # stale socket of an earlier run
        self._executor = cf.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self.name)
        self._server = grpcaio.run(self._serve(self._executor))
        self._inode = ident(self.path)
        if self._inode is None:
            self.stop()
            raise OSError(f"{self.name}: gRPC server did not create its socket {self.path}")

    async def _serve(self, pool: cf.ThreadPoolExecutor) -> grpc.aio.Server:
        server = grpc.aio.server()
        self.add(grpcaio.AdaptingServer(server, pool))
        server.add_insecure_port(f"unix://{self.path}")
        await server.start()
        return server

    def socket_ok(self) -> bool:
        return self._server is not None and self._inode is not None and ident(self.path) == self._inode

    def stop(self, grace: float = 0.5) -> None:
        server, self._server = self._server, None
        if server is not None:
            try:
                grpcaio.run(server.stop(grace), timeout=grace + 1.0)
            except cf.TimeoutError:
                logger.warning("%s: gRPC server did not stop within %.1fs", self.name, grace + 1.0)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._inode is not None and ident(self.path) == self._inode:  # never a newer instance's
            try:
                os.unlink(self.path)
            except OSError:
                pass
        self._inode = None


class RegistrationServicer(reg_pb2_grpc.RegistrationServicer):
    """The plugin watcher's registration service: who we are (``type``: ``DevicePlugin`` or ``DRAPlugin``,
    ``name``, the ``endpoint`` the kubelet dials, the versions served) and what the kubelet made of it."""

    def __init__(self, plugin_type: str, name: str, endpoint: str, versions: Sequence[str],
                 on_status: Callable[[bool, str], None]) -> None:
        self.plugin_type = plugin_type
        self.name = name
        self.endpoint = endpoint
        self.versions = list(versions)
        self.on_status = on_status

    def GetInfo(self, request, context):  # noqa: N802 - gRPC method name
        return reg_pb2.PluginInfo(type=self.plugin_type, name=self.name, endpoint=self.endpoint,
                                  supported_versions=self.versions)

    def NotifyRegistrationStatus(self, request, context):  # noqa: N802
        self.on_status(request.plugin_registered, request.error)
        return reg_pb2.RegistrationStatusResponse()


async def run_rpc(runner: DeadlineRunner, what: str, context: grpc.aio.ServicerContext,
                  body: Callable[[RpcBudget], T], expected: Mapping[type[BaseException], grpc.StatusCode],
                  record: Callable[[float, str], None] | None = None, log: logging.Logger | None = None) -> T:
    """``body`` under ``runner``, for a servicer method served on the gRPC loop (``async def``); a deadline,
    an error of a type in ``expected`` (logged, answered with its status) or a bug (logged with its
    traceback, INTERNAL) aborts the RPC, so the kubelet gets an answer and the server lives on.
    ``record(seconds, code)`` counts every call ("OK", the status name, or CANCELLED when the caller left).
    ``log``: the calling plugin's logger, so a refusal is logged under the plugin that refused."""
    log = log or logger
    start = time.perf_counter()
    code = "OK"
    try:
        return await runner.run_async(body, what)
    except DeadlineExceeded as exc:
        code, status, details = "DEADLINE_EXCEEDED", grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)
        log.error("%s", exc)
    except tuple(expected) as exc:
        status = next(st for kind, st in expected.items() if isinstance(exc, kind))
        code, details = status.name, str(exc)
        log.error("%s", exc)
    except asyncio.CancelledError:
        code = "CANCELLED"
        raise
    except Exception as exc:  # a bug must not hang or kill the server: report it to the kubelet
        code, status = "INTERNAL", grpc.StatusCode.INTERNAL
        details = f"{what} failed: {type(exc).__name__}: {exc}"
        log.exception("%s failed unexpectedly", what)
    finally:
        if record is not None:
            record(time.perf_counter() - start, code)
    await context.abort(status, details)
    raise AssertionError("unreachable")  # context.abort raises


__all__ = ["DeadlineExceeded", "DeadlineRunner", "RegistrationServicer", "SocketServer", "ident", "run_rpc"]
