"""The one error tree of Dressage.

Every error raised on purpose derives from :class:`DressageError`. Third-party exceptions
(SQLAlchemy, httpx, bubblewrap, engines) are translated at one seam with ``raise ... from e``,
and every message names the thing involved and what to do about it.
"""

from __future__ import annotations


class DressageError(Exception):
    """Root of every error Dressage raises on purpose."""


class VerificationError(DressageError):
    """A check found recorded data that does not match (exit code 3 on the command line)."""


class ConfigError(DressageError):
    """A configuration value, file or command-line option is invalid or missing."""


class NotSupportedError(DressageError):
    """A feature that is recognised but not built (yet); the message says what to use instead."""


# --- store -------------------------------------------------------------------------------------


class StoreError(DressageError):
    """The event log refused or failed an operation."""


class ExportVerificationError(StoreError, VerificationError):
    """An export directory does not match its manifest (missing, extra or altered files)."""


class SchemaError(StoreError):
    """The database schema is missing or not at the expected revision."""


class UnknownRunError(StoreError):
    """A run name or id that the log does not hold."""


class UnknownSessionError(StoreError):
    """A session id or token that the log does not hold."""


class InvalidRecordError(StoreError):
    """A record violates the log's invariants (array lengths, sizes, encodings); nothing was written.

    ``field`` names the record's field at fault where one is known (an HTTP answer's ``param``)."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class TurnIndexTakenError(InvalidRecordError):
    """The session already recorded a turn at this index (another writer, e.g. a second proxy, won the race)."""


class IdempotencyConflictError(StoreError):
    """The same idempotency key was appended again with different content (non-determinism)."""


class LeaseError(StoreError):
    """A task lease is not held by the caller, or expired."""


# --- tokenization / templates ------------------------------------------------------------------


class TokenizationError(DressageError):
    """Text could not be turned into token ids (or back) as required."""


class TemplateError(DressageError):
    """A conversation could not be rendered by the model's chat template."""


class ToolCallParseError(DressageError):
    """Model output contained a tool call that could not be parsed."""


# --- engines / proxy ---------------------------------------------------------------------------


class EngineError(DressageError):
    """The inference engine failed or answered something unexpected."""


class EngineBroadcastError(EngineError):
    """A command sent to every engine of a pool failed on some of them.

    ``failures`` lists ``(engine URL, error)`` for each engine that failed.
    """

    def __init__(self, message: str, failures: list[tuple[str, EngineError]]) -> None:
        super().__init__(message)
        self.failures = failures


class EngineHTTPError(EngineError):
    """The inference engine answered with an HTTP error status (``status_code``: 4xx or 5xx)."""

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class EngineAbortedError(EngineError):
    """A generation was aborted by the engine (pause for a weight update, explicit abort)."""


class EnginesLostError(EngineError):
    """Every engine of a rollout died and none could be restarted: the worker stopped claiming and
    left its pairs retryable (the message says how to resume)."""


class ContextLengthExceededError(DressageError):
    """A request's prompt does not fit the model's context window."""


class RequestError(DressageError):
    """A client request is malformed or uses something unsupported (HTTP 400)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class ConflictError(RequestError):
    """A request contradicts one already recorded, e.g. an ``Idempotency-Key`` reused with another body (HTTP 409)."""


class AuthError(DressageError):
    """A bearer token is missing, unknown or belongs to a finished session (HTTP 401)."""


# --- sandboxes / agents / rollout --------------------------------------------------------------


class SandboxError(DressageError):
    """A sandbox could not be created, used or terminated."""


class SandboxUnavailableError(SandboxError):
    """The sandbox provider cannot work on this machine (missing binary, no user namespaces, no key)."""


class AgentError(DressageError):
    """An agent crashed, hung, or could not be started."""


class RewardError(DressageError):
    """A reward function failed or is misconfigured."""


class NoScalarRewardError(RewardError):
    """The task's rewards were read whole, but no rule of the run picks the one number that trains
    (e.g. a multi-key Harbor ``reward.json`` in a run that sets no ``reward.key``/``reward.weights``):
    the session finishes with its rewards kept and a NULL scalar ``reward``, saying this message."""


# --- training ----------------------------------------------------------------------------------


class TrainingError(DressageError):
    """Training could not materialize samples, step, or checkpoint."""


class ReplayDriftError(TrainingError, VerificationError):
    """Re-materializing a recorded step did not reproduce its hash."""


# --- run control -------------------------------------------------------------------------------


class Interrupted(DressageError):
    """A command stopped on SIGINT, SIGTERM or a ``dressage-worker stop`` request, cleanly: the
    message is how to resume (``resume with dressage-worker ...``); it exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
