"""adapm: adaptive parameter management for distributed training of sparse models.

The application signals *intent* (which keys a worker will access in which future clocks); the
manager decides per key and at run time whether to relocate or replicate it. See README.md.

    node = adapm.init(num_keys=1000, value_length=16)
    w = node.worker()
    w.push([1, 2], np.ones((2, 16), np.float32))
    w.pull([1, 2])
    node.shutdown()
"""

from .checkpoint import checkpoint_meta
from .config import Config
from .errors import (
    AdaPMError,
    AdaPMTimeout,
    CheckpointError,
    ConfigError,
    InvalidArgument,
    InvalidType,
    NodeFailure,
    PeerError,
    StateError,
    TransportError,
)
from .node import Node, init
from .sampling import Sampling
from .worker import Worker

# The one version source: pyproject.toml reads this line (statically, without importing adapm).
__version__ = "0.1.0"

__all__ = [
    "init",
    "checkpoint_meta",
    "Config",
    "Sampling",
    "Node",
    "Worker",
    "AdaPMError",
    "AdaPMTimeout",
    "CheckpointError",
    "ConfigError",
    "InvalidArgument",
    "InvalidType",
    "NodeFailure",
    "PeerError",
    "StateError",
    "TransportError",
]


def __getattr__(name: str):
    # adapm.trace on first use: reading traces needs pyarrow, which `import adapm` does not load.
    if name == "trace":
        import importlib

        return importlib.import_module(".trace", __name__)
    raise AttributeError(f"module 'adapm' has no attribute {name!r}")
