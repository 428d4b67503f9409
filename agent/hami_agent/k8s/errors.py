"""Errors of the Kubernetes API layer. Messages name the verb, the object and the HTTP status, in the
words the seeds grep for, e.g. ``patch node error: 409 Conflict on node gpu-1``."""

from __future__ import annotations

from http import HTTPStatus


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class KubeError(Exception):
    """A failed API call. ``status`` is the HTTP status, 0 when no response arrived (connection refused,
    timeout); ``reason`` is the API's Status reason (``Conflict``, ``NotFound``, ...) or the transport
    failure; ``message`` is the server's message."""

    def __init__(self, status: int, reason: str, message: str, verb: str, kind: str,  # noqa: PLR0917
                 name: str = "", retry_after_s: float | None = None) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.verb = verb
        self.kind = kind
        self.name = name
        self.retry_after_s = retry_after_s
        super().__init__(self.__str__())

    @property
    def summary(self) -> str:
        what = f" on {self.kind} {self.name}" if self.name else ""
        if self.status:
            return f"{self.verb} {self.kind} error: {self.status} {_phrase(self.status)}{what}"
        return f"{self.verb} {self.kind} error: {self.reason}{what}"

    @property
    def transient(self) -> bool:
        """Worth retrying: no response, throttled, or a server-side failure."""
        return self.status in {0, 429} or self.status >= 500

    def __str__(self) -> str:
        return f"{self.summary}: {self.message}" if self.message else self.summary


class NotFoundError(KubeError):
    """404: the object does not exist."""


class ConflictError(KubeError):
    """409: stale resourceVersion (optimistic concurrency), already exists, or already bound."""


class ExpiredError(KubeError):
    """410 Gone / Expired: a watch's resourceVersion is older than the server's history; relist."""


class KubeTimeoutError(KubeError):
    """No answer within the call's timeout (status 0)."""


class ThrottledError(KubeTimeoutError):
    """The client's own rate limit would delay the request past its timeout: nothing was sent, and a
    retry would only wait longer (client-go fails such a request with its context's deadline)."""

    @property
    def transient(self) -> bool:
        return False


class KubeConfigError(Exception):
    """No usable credentials: the message says which sources were tried and how to fix it."""


def error_for(status: int, reason: str, message: str, verb: str, kind: str,  # noqa: PLR0917
              name: str = "", retry_after_s: float | None = None) -> KubeError:
    cls: type[KubeError] = KubeError
    if status == 404:
        cls = NotFoundError
    elif status == 409:
        cls = ConflictError
    elif status == 410:
        cls = ExpiredError
    return cls(status, reason, message, verb, kind, name, retry_after_s)
