"""The kubelet plugins' synchronous servicers served by a ``grpc.aio`` server (issue 31, item 2).

Why: an idle ``grpc.server`` (the synchronous one) wakes its completion-queue thread every 200 ms
(``_INTERRUPT_CHECK_PERIOD_MS`` in grpcio's ``_cygrpc/completion_queue.pyx.pxi``) and its C core threads
several times a second: ~0.6 ms/s of CPU per socket on an idle node, measured. A ``grpc.aio`` server on one
asyncio loop thread sleeps until a call arrives.

A servicer's synchronous methods (the ListAndWatch streams, which block between updates, and the
registration service) run on the socket's own thread pool, as with the synchronous server, through the
adapter below. Its ``async`` unary methods (the deadline-bound RPCs, ``kubeletplugin.run_rpc``) are served
by grpc.aio as they are, on the loop: one thread hand-off less per call, each way.
grpcio's own sync-handler support in ``grpc.aio`` is not used: its streaming path never calls the
``add_callback`` callbacks, its context has no ``is_active``, and its ``abort`` returns instead of raising
(``_SyncServicerContext`` in grpcio's ``_cygrpc/aio/server.pyx.pxi``) -- a ListAndWatch stream would not
notice the kubelet leaving until its next wait ran out.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc
from grpc import aio
from grpc._cython import cygrpc

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()
CALL_TIMEOUT_S = 10.0  # starting or stopping a server on the loop; never waited on without a bound


def loop() -> asyncio.AbstractEventLoop:
    """The process's one asyncio loop for gRPC servers (grpc.aio binds its poller to one loop)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            new = asyncio.new_event_loop()
            threading.Thread(target=new.run_forever, name="grpc-aio", daemon=True).start()
            asyncio.run_coroutine_threadsafe(_hold_grpc_aio(), new).result(CALL_TIMEOUT_S)
            _loop = new
        return _loop


async def _hold_grpc_aio() -> None:
    """Keep grpc.aio's process-wide poller up for the life of the process.

    grpc.aio counts the servers and channels alive (``init_grpc_aio`` / ``shutdown_grpc_aio`` in grpcio's
    ``_cygrpc/aio/grpc_aio.pyx.pxi``) and shuts its poller down when the count reaches zero, in whichever
    thread frees the last one. A server stopped and dropped by the device plugin's main thread (a restart, a
    SIGTERM) then closed the poller's socket under this loop, which was reading it: ``OSError: [Errno 9]
    Bad file descriptor`` in ``PollerCompletionQueue._handle_events`` (found by the chaos soak). One count
    taken here, on the loop's own thread as grpc.aio requires, is never given back."""
    init = getattr(cygrpc, "init_grpc_aio", None)
    if init is not None:
        init()


def run(coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT_S) -> T:
    """``coro`` on the server loop, from any other thread; at most ``timeout`` seconds."""
    return asyncio.run_coroutine_threadsafe(coro, loop()).result(timeout)


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class SyncContext:
    """What the synchronous servicers use of ``grpc.ServicerContext``, for a call served by grpc.aio."""

    def __init__(self, context: aio.ServicerContext) -> None:
        self._context = context
        self._callbacks: list[Callable[[], None]] = []
        self._done = threading.Event()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        if self._done.is_set():
            return False
        self._callbacks.append(callback)
        return True

    def is_active(self) -> bool:
        return not self._done.is_set()

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(code, details)  # answered by the adapter on the loop

    def time_remaining(self) -> float | None:
        return self._context.time_remaining()

    def invocation_metadata(self):
        return self._context.invocation_metadata()

    def peer(self) -> str:
        return self._context.peer()

    def finish(self) -> None:
        """The call ended (answered, failed or cancelled by the client): as the synchronous server does,
        run the callbacks once."""
        if self._done.is_set():
            return
        self._done.set()
        for callback in self._callbacks:
            callback()


def _unary(fn: Callable, pool: cf.Executor) -> Callable:
    async def handler(request, context: aio.ServicerContext):
        ctx = SyncContext(context)
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, request, ctx)
        except _Aborted as exc:
            await context.abort(exc.code, exc.details)
        finally:
            ctx.finish()
    return handler


def _stream(fn: Callable, pool: cf.Executor) -> Callable:
    async def handler(request, context: aio.ServicerContext):
        ctx = SyncContext(context)
        running = asyncio.get_running_loop()
        items = iter(())
        pending: asyncio.Future | None = None
        end = object()
        try:
            items = fn(request, ctx)
            while True:
                pending = running.run_in_executor(pool, next, items, end)
                # shielded: a cancelled call must not cancel the ``next`` still running in the pool
                item = await asyncio.shield(pending)
                pending = None
                if item is end:
                    return
                yield item
        except _Aborted as exc:
            await context.abort(exc.code, exc.details)
        finally:
            ctx.finish()  # wakes a generator waiting in the pool, as the sync server's callbacks do
            _close_after(items, pending, pool)
    return handler


def _close_after(items, pending: asyncio.Future | None, pool: cf.Executor) -> None:
    """Close the generator (runs its ``finally``) once no ``next`` is running in the pool."""
    close = getattr(items, "close", None)
    if close is None:
        return

    def closing(done: asyncio.Future | None = None) -> None:
        if done is not None and not done.cancelled():
            done.exception()  # retrieved: the call is over, nobody else will look
        try:
            pool.submit(close)
        except RuntimeError:  # the pool is shut down: close here
            close()

    if pending is None or pending.done():
        closing(pending)
    else:
        pending.add_done_callback(closing)


def _adapt(handler: grpc.RpcMethodHandler | None, pool: cf.Executor) -> grpc.RpcMethodHandler | None:
    if handler is None or handler.request_streaming:
        return handler  # the kubelet APIs have no client streams
    if inspect.iscoroutinefunction(handler.unary_unary):
        return handler  # an ``async`` method: grpc.aio runs it on the loop as it is
    if handler.response_streaming:
        return handler._replace(unary_stream=_stream(handler.unary_stream, pool))
    return handler._replace(unary_unary=_unary(handler.unary_unary, pool))


class _AdaptedGeneric(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler, pool: cf.Executor) -> None:
        self._inner = inner
        self._pool = pool

    def service(self, handler_call_details):
        return _adapt(self._inner.service(handler_call_details), self._pool)


class AdaptingServer:
    """Takes the generated ``add_*Servicer_to_server`` calls for a ``grpc.aio`` server, each synchronous
    method wrapped to run on ``pool``."""

    def __init__(self, server: aio.Server, pool: cf.Executor) -> None:
        self._server = server
        self._pool = pool

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._server.add_generic_rpc_handlers(tuple(_AdaptedGeneric(h, self._pool) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self._server.add_registered_method_handlers(
            service, {name: _adapt(h, self._pool) for name, h in handlers.items()})


__all__ = ["AdaptingServer", "SyncContext", "loop", "run"]
