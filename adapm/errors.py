"""The error hierarchy. Every error adapm raises derives from :class:`AdaPMError`.

Input errors also derive from the matching builtin (``ValueError`` / ``TypeError``) so that code
written against numpy conventions keeps working. Transport failures are translated into
:class:`TransportError` at the I/O boundary (``raise ... from`` keeps the original cause).
"""

from __future__ import annotations


class AdaPMError(Exception):
    """Base class of every error raised by adapm."""


class InvalidArgument(AdaPMError, ValueError):
    """An argument has a bad value (key out of range, wrong shape, ``end <= start``, ...).

    Raised before any state changes; the node keeps working.
    """


class InvalidType(AdaPMError, TypeError):
    """An argument has a bad type or dtype (float keys, float64 values, ...)."""


class ConfigError(AdaPMError, ValueError):
    """A configuration value (argument or ``ADAPM_*`` environment variable) is invalid."""


class StateError(AdaPMError, RuntimeError):
    """The call does not fit the node's state: use after shutdown, ``init`` twice, ..."""


class AdaPMTimeout(AdaPMError, TimeoutError):
    """A blocking call waited longer than its configured timeout.

    The message names this node's rank, the peer rank (if any) and what was awaited.
    """


class TransportError(AdaPMError, ConnectionError):
    """A ZeroMQ or network failure, translated at the transport boundary."""


class PeerError(AdaPMError):
    """A peer node reported that it failed to serve one of our requests."""


class CheckpointError(AdaPMError):
    """A checkpoint could not be written, or what is at the path is missing, incomplete,
    corrupt (checksum) or of an unknown format. The message names the path."""


class NodeFailure(AdaPMError):
    """A node of the job died or stopped answering; the job cannot go on.

    ``rank`` is the failed node's rank, ``what`` what this node was doing or waiting for when it
    noticed. Every later call on this node raises it too: shut down and exit non-zero.
    """

    def __init__(self, message: str, rank: int = -1, what: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.what = what


__all__ = [
    "AdaPMError",
    "InvalidArgument",
    "InvalidType",
    "ConfigError",
    "StateError",
    "AdaPMTimeout",
    "TransportError",
    "PeerError",
    "NodeFailure",
    "CheckpointError",
]
