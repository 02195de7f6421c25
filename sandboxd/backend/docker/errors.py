"""The engine's errors, told apart in one table and translated into ``SandboxdError``.

Every failure of an SDK call goes through :func:`translate`. An answer of the engine
(``docker.errors.APIError``) is classified by :data:`RULES`, keyed by its HTTP status, its
SDK error type and the engine's own words for it (its ``message``: the engine has no finer
code), and becomes an :class:`EngineError` that carries the :class:`EngineErrorKind`. The
first rule that matches wins::

    status  error type      the engine's words         kind
    any     ImageNotFound   -                          IMAGE_NOT_FOUND
    any     NotFound        -                          NOT_FOUND
    400     APIError        "invalid reference"        INVALID_REFERENCE
    409     APIError        "already in progress"      REMOVAL_IN_PROGRESS
    409     APIError        "is not running"           NOT_RUNNING
    409     APIError        "is paused"                NOT_RUNNING
    409     APIError        "already in use"           NAME_IN_USE
    409     APIError        "Conflict"                 NAME_IN_USE
    any     APIError        "no space left on device"  NO_SPACE
    (none of them)                                     OTHER

Independently of its kind, an answer with a 5xx status is ``transient``: the engine failed
rather than refused, and the same idempotent call may succeed when retried.

Anything else is no answer: an engine that cannot be reached or did not answer in time is
``DockerUnavailableError``; any other failure a plain ``BackendError``.
"""

from __future__ import annotations

import dataclasses
import enum

import docker.errors
import requests.exceptions

from ...errors import BackendError, DockerUnavailableError, SandboxdError

__all__ = ["RULES", "EngineError", "EngineErrorKind", "Rule", "classify", "kind_of", "translate"]


class EngineErrorKind(enum.Enum):
    """What the engine's refusal means, as far as a caller acts on it."""

    NOT_FOUND = "not_found"
    """No such container, volume, network or exec (the caller says which it asked for)."""
    IMAGE_NOT_FOUND = "image_not_found"
    """No such image."""
    INVALID_REFERENCE = "invalid_reference"
    """The image reference is malformed."""
    NAME_IN_USE = "name_in_use"
    """Another container already bears the name (a create or a rename lost a race)."""
    REMOVAL_IN_PROGRESS = "removal_in_progress"
    """The container is being removed by someone else already."""
    NOT_RUNNING = "not_running"
    """The container is stopped or paused: it runs no command."""
    NO_SPACE = "no_space"
    """A capped volume (or the engine's disk) is full."""
    OUT_OF_RESOURCES = "out_of_resources"
    """The machine could not give what a container needs: processes (EAGAIN from a fork or a
    clone: the kernel's pid_max, or a limit on tasks), memory, or descriptors."""
    OTHER = "other"
    """Anything the table does not name."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule:
    """One row of :data:`RULES`: what an answer must be to be of ``kind``."""

    status: int | None
    """The HTTP status code; None matches any (and an error built without a response)."""
    error_type: type[docker.errors.APIError]
    """The SDK's class for it (it sorts 404s into ``NotFound`` and ``ImageNotFound``)."""
    words: str
    """Words in the engine's message (case-sensitive, as the engine writes them); "" matches any."""
    kind: EngineErrorKind

    def matches(self, exc: docker.errors.APIError) -> bool:
        """Whether ``exc`` is of this rule's status, type and words."""
        return (
            isinstance(exc, self.error_type)
            and (self.status is None or exc.status_code == self.status)
            and self.words in _engine_text(exc)
        )


_Kind = EngineErrorKind
RULES: tuple[Rule, ...] = (
    # docker-py sorts a 404 by its words already; callers give not-found its meaning (workspace,
    # image, nothing to remove), so these pass through as the SDK's own exceptions.
    Rule(status=None, error_type=docker.errors.ImageNotFound, words="", kind=_Kind.IMAGE_NOT_FOUND),
    Rule(status=None, error_type=docker.errors.NotFound, words="", kind=_Kind.NOT_FOUND),
    # "invalid reference format: repository name must be lowercase"
    Rule(status=400, error_type=docker.errors.APIError, words="invalid reference", kind=_Kind.INVALID_REFERENCE),
    # The engine says every one of these with 409 Conflict; the words tell them apart.
    # "removal of container <id> is already in progress"
    Rule(status=409, error_type=docker.errors.APIError, words="already in progress", kind=_Kind.REMOVAL_IN_PROGRESS),
    # "Container <id> is not running" / "Container <id> is paused, unpause the container before exec"
    Rule(status=409, error_type=docker.errors.APIError, words="is not running", kind=_Kind.NOT_RUNNING),
    Rule(status=409, error_type=docker.errors.APIError, words="is paused", kind=_Kind.NOT_RUNNING),
    # "Conflict. The container name "/x" is already in use by container <id>" (a create, or a rename's
    # "Error when allocating new name: Conflict. ..."); "Conflict" alone is the reason of a bare 409.
    Rule(status=409, error_type=docker.errors.APIError, words="already in use", kind=_Kind.NAME_IN_USE),
    Rule(status=409, error_type=docker.errors.APIError, words="Conflict", kind=_Kind.NAME_IN_USE),
    # Said by whichever step ran out (a start copying the image's /workspace into a capped volume,
    # an archive upload), with the status of that step: any.
    Rule(status=None, error_type=docker.errors.APIError, words="no space left on device", kind=_Kind.NO_SPACE),
    # A container's start that the machine could not give a process, memory or a descriptor: the
    # runtime's own fork says "fork/exec ...: resource temporarily unavailable" (EAGAIN).
    Rule(
        status=None,
        error_type=docker.errors.APIError,
        words="resource temporarily unavailable",
        kind=_Kind.OUT_OF_RESOURCES,
    ),
    Rule(status=None, error_type=docker.errors.APIError, words="cannot allocate memory", kind=_Kind.OUT_OF_RESOURCES),
    Rule(status=None, error_type=docker.errors.APIError, words="too many open files", kind=_Kind.OUT_OF_RESOURCES),
)
"""The one table of engine errors (see the module docstring); the first match wins."""


class EngineError(BackendError):
    """The engine answered a call with an error: its classification travels with it.

    Args:
        message: the caller-facing message.
        kind: what the refusal means (:data:`RULES`).
        status_code: the HTTP status of the engine's answer, or None when it had none.
        transient: whether the same call may succeed if retried (a 5xx status).
    """

    def __init__(
        self, message: str, *, kind: EngineErrorKind, status_code: int | None, transient: bool = False
    ) -> None:
        super().__init__(message, transient=transient)
        self.kind = kind
        self.status_code = status_code


def classify(exc: docker.errors.APIError) -> EngineErrorKind:
    """The kind of the engine's answer ``exc``: the first rule of :data:`RULES` it matches, else OTHER."""
    return next((rule.kind for rule in RULES if rule.matches(exc)), EngineErrorKind.OTHER)


def kind_of(exc: BaseException) -> EngineErrorKind:
    """The kind of an error raised by an engine call: an :class:`EngineError`'s own, else OTHER."""
    return exc.kind if isinstance(exc, EngineError) else EngineErrorKind.OTHER


def translate(exc: Exception, *, docker_host: str) -> SandboxdError:
    """The ``SandboxdError`` an SDK failure is reported as (a ``SandboxdError`` is returned as it is).

    Args:
        exc: what the SDK call raised.
        docker_host: the engine's address, for the message.

    Returns:
        ``DockerUnavailableError`` when the engine cannot be reached or did not answer in
        time; an :class:`EngineError` (kind and ``transient`` from :data:`RULES`) for its
        error answer; a plain ``BackendError`` for anything else.
    """
    if isinstance(exc, SandboxdError):
        return exc
    if isinstance(exc, requests.exceptions.ConnectionError | FileNotFoundError | ConnectionError):
        return DockerUnavailableError(f"Docker engine unreachable at {docker_host}: {reason(exc)}")
    if isinstance(exc, requests.exceptions.Timeout):
        return DockerUnavailableError(f"Docker engine at {docker_host} did not answer in time")
    if isinstance(exc, docker.errors.APIError):
        status = exc.status_code
        return EngineError(
            f"Docker engine error: {_engine_text(exc)}",
            kind=classify(exc),
            status_code=status,
            transient=status is not None and status >= 500,
        )
    if isinstance(exc, docker.errors.DockerException):
        return DockerUnavailableError(f"Docker engine at {docker_host} failed: {exc}")
    return BackendError(f"Docker call failed: {exc}")


def reason(exc: BaseException) -> str:
    """The first line of ``exc``'s text (its type's name when it has none), at most 300 characters."""
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]


def _engine_text(exc: docker.errors.APIError) -> str:
    """The engine's message, or the SDK's text for an answer without one (it names the status's reason)."""
    return str(exc.explanation or exc)
