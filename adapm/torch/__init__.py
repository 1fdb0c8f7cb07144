"""PyTorch integration (install with the ``torch`` extra: ``pip install adapm[torch]``).

- :class:`IntentCollate` and :class:`IntentLoader`: intent from the data loader (``data``);
- :class:`Embedding` and :class:`EmbeddingBag`: tables whose rows live in adapm (``nn``);
  :class:`EmbeddingBagCollection` and :func:`jagged_keys` for TorchRec's ``KeyedJaggedTensor``
  (duck-typed, torchrec is not needed);
- ``adapm.torch.optim.SGD`` and ``adapm.torch.optim.Adagrad``: their sparse row updates;
- :class:`DenseSync`: dense parameters kept consistent across nodes through adapm (``dense``);
- :func:`sharded_state_dict`: tables sharded by rows for ``torch.distributed.checkpoint``
  (``state``).

``import adapm`` does not import torch; ``import adapm.torch`` does.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("adapm.torch needs PyTorch: pip install 'adapm[torch]'") from exc

from . import optim
from .data import IntentCollate, IntentLoader, KeyedBatch, jagged_keys
from .dense import DenseSync
from .nn import Embedding, EmbeddingBag, EmbeddingBagCollection
from .state import sharded_state_dict

__all__ = [
    "DenseSync",
    "Embedding",
    "EmbeddingBag",
    "EmbeddingBagCollection",
    "IntentCollate",
    "IntentLoader",
    "KeyedBatch",
    "jagged_keys",
    "optim",
    "sharded_state_dict",
]
