"""TorchRec's KeyedJaggedTensor as input (several tables in one input), without torchrec.

torchrec is not installed here (it would replace torch), so ``StandInKJT`` below is a TEST
STAND-IN, written for this test: the part of ``torchrec.KeyedJaggedTensor``'s interface that
adapm uses (``keys()``, ``kjt[name]`` -> a jagged tensor with ``values()``, ``offsets()`` of
batch + 1 entries and ``weights_or_none()``), laid out as torchrec lays it out (one values
tensor, lengths per feature then per example).
"""

from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest
import torch

import adapm
from adapm.torch import (
    EmbeddingBag,
    EmbeddingBagCollection,
    IntentCollate,
    jagged_keys,
    optim,
)

torch.set_num_threads(1)


class StandInJT:
    """Test stand-in for torchrec.JaggedTensor (values, offsets, optional weights)."""

    def __init__(self, values, offsets, weights=None) -> None:
        self._values, self._offsets, self._weights = values, offsets, weights

    def values(self):
        return self._values

    def offsets(self):
        return self._offsets

    def weights_or_none(self):
        return self._weights


class StandInKJT:
    """Test stand-in for torchrec.KeyedJaggedTensor: ``keys``, one ``values`` tensor and
    ``lengths`` (feature-major: all examples of feature 0, then of feature 1, ...)."""

    def __init__(self, keys, values, lengths, weights=None) -> None:
        self._keys, self._values, self._lengths, self._weights = keys, values, lengths, weights

    def keys(self):
        return list(self._keys)

    def __getitem__(self, name):
        batch = len(self._lengths) // len(self._keys)
        f = self._keys.index(name)
        lengths = self._lengths[f * batch:(f + 1) * batch]
        start = int(self._lengths[:f * batch].sum())
        end = start + int(lengths.sum())
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)])
        weights = None if self._weights is None else self._weights[start:end]
        return StandInJT(self._values[start:end], offsets, weights)


def random_kjt(rng, keys, sizes, batch, weighted=False):
    lengths = torch.from_numpy(rng.integers(0, 4, len(keys) * batch))
    values = torch.cat([torch.from_numpy(rng.integers(0, sizes[k], int(n)))
                        for k, n in zip(keys, lengths.reshape(len(keys), batch).sum(1))])
    weights = torch.from_numpy(rng.random(len(values)).astype(np.float32)) if weighted else None
    return StandInKJT(keys, values, lengths, weights)


def keys_of(batch, offsets):
    return jagged_keys(batch, offsets)


@pytest.mark.parametrize("weighted", [False, True])
def test_a_collection_takes_a_keyed_jagged_tensor_and_trains_as_torch_does(no_launcher,
                                                                           weighted):
    with adapm.init(num_keys=100, value_length=8) as node:
        w = node.worker()
        mode = "sum"
        ours = EmbeddingBagCollection({
            "user": EmbeddingBag(40, 4, mode=mode, worker=w, seed=1),
            "item": EmbeddingBag(30, 4, mode=mode, worker=w, offset=40, seed=2,
                                 include_last_offset=True),
        })
        assert ours.offsets == {"user": 0, "item": 40}
        twins = {name: torch.nn.EmbeddingBag(t.num_embeddings, 4, mode=mode, sparse=True)
                 for name, t in ours.tables.items()}
        with torch.no_grad():
            for name, twin in twins.items():
                twin.weight.copy_(ours.tables[name].weight)
        opt = optim.Adagrad(ours, lr=0.3)
        twin_opt = torch.optim.Adagrad([t.weight for t in twins.values()], lr=0.3)
        rng = np.random.default_rng(0)
        for _ in range(4):
            # "ads": a feature without a table, ignored
            kjt = random_kjt(rng, ["item", "ads", "user"], {"user": 40, "item": 30, "ads": 5},
                             batch=5, weighted=weighted)
            opt.zero_grad()
            twin_opt.zero_grad()
            out = ours(kjt)
            assert sorted(out) == ["item", "user"] and out["user"].shape == (5, 4)
            expected = {}
            for name, twin in twins.items():
                jt = kjt[name]
                expected[name] = twin(jt.values(), jt.offsets()[:-1],
                                      per_sample_weights=jt.weights_or_none())
            for name in out:
                torch.testing.assert_close(out[name], expected[name])
            sum((o * (i + 1)).pow(2).sum() for i, o in enumerate(out.values())).backward()
            sum((o * (i + 1)).pow(2).sum() for i, o in enumerate(expected.values())).backward()
            opt.step()
            twin_opt.step()
        for name, twin in twins.items():
            torch.testing.assert_close(ours.tables[name].weight, twin.weight.detach(),
                                       rtol=1e-5, atol=1e-6)
        # the collate side: the batch's adapm keys, picklable for loader workers
        collate = IntentCollate(lambda b: b[0], functools.partial(keys_of,
                                                                  offsets=ours.offsets))
        keyed = collate([kjt])
        want = np.unique(np.concatenate([kjt["user"].values().numpy(),
                                         kjt["item"].values().numpy() + 40]))
        np.testing.assert_array_equal(np.sort(keyed.keys), want)
        pickle.dumps(functools.partial(keys_of, offsets=ours.offsets))
        with pytest.raises(adapm.InvalidArgument, match="no feature"):
            ours(random_kjt(rng, ["user"], {"user": 40}, batch=2))
        with pytest.raises(adapm.InvalidType, match="KeyedJaggedTensor"):
            ours(torch.tensor([1, 2]))
        with pytest.raises(adapm.InvalidType, match="KeyedJaggedTensor"):
            jagged_keys([1, 2], ours.offsets)
        with pytest.raises(adapm.InvalidType, match="EmbeddingBag"):
            EmbeddingBagCollection({"user": torch.nn.EmbeddingBag(3, 2)})
        with pytest.raises(adapm.InvalidArgument, match="no tables"):
            EmbeddingBagCollection({})
