"""Wide & Deep (Cheng et al., 2016) for click-through rates, with its tables given from outside.

The wide part is a linear model: one weight per categorical value (an ``EmbeddingBag`` of width
1 summing the example's 26 values) plus a linear layer on the integer features. The deep part
embeds each categorical value (an ``Embedding`` of ``dim``), concatenates the 26 embeddings with
the integer features and runs an MLP. The logit is the sum of both parts.

The tables are arguments, so that one model class serves both runs: adapm's
``adapm.torch.Embedding`` / ``EmbeddingBag`` (rows in adapm, distributed) and torch's
``nn.Embedding`` / ``nn.EmbeddingBag`` (the single-process baseline).
"""

from __future__ import annotations

import torch
from criteo import NUM_CATEGORICAL, NUM_INTEGER
from torch import nn


class WideAndDeep(nn.Module):
    def __init__(self, deep: nn.Module, wide: nn.Module, dim: int,
                 hidden: tuple[int, ...] = (256, 128)) -> None:
        super().__init__()
        self.deep_table = deep  # (n, 26) indices -> (n, 26, dim)
        self.wide_table = wide  # (n, 26) indices -> (n, 1), summed
        self.wide_dense = nn.Linear(NUM_INTEGER, 1)
        layers: list[nn.Module] = []
        width = NUM_CATEGORICAL * dim + NUM_INTEGER
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def dense_parameters(self) -> list[nn.Parameter]:
        """The parameters outside the tables (for a torch optimizer)."""
        return list(self.wide_dense.parameters()) + list(self.mlp.parameters())

    def forward(self, dense: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        """Logits (n,) of ``dense`` (n, 13) float features and ``categorical`` (n, 26) indices."""
        embedded = self.deep_table(categorical).flatten(1)
        deep = self.mlp(torch.cat([embedded, dense], dim=1))
        wide = self.wide_table(categorical) + self.wide_dense(dense)
        return (deep + wide).squeeze(1)
