"""The weights fingerprint changes with any one word of any tensor, and only with the weights."""

from __future__ import annotations

import pytest
import torch

from align.generation.fingerprint import checksum, fingerprint


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8])
def test_one_changed_word_changes_the_checksum(dtype):
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(4097, generator=g) * 20).to(dtype)
    base = int(checksum(t))
    for i in (0, 1, 2048, 4096):
        for byte in range(t.element_size()):  # every byte of the element is read
            u = t.clone()
            u.view(torch.uint8)[i * t.element_size() + byte] ^= 1  # one bit of one element
            assert int(checksum(u)) != base, (dtype, i, byte)
    assert int(checksum(t.clone())) == base


def test_swapped_elements_change_the_checksum():
    """Positions are weighed: a plain sum of words would not see a permutation."""
    t = torch.arange(8, dtype=torch.float32)
    assert int(checksum(t)) != int(checksum(t.flip(0)))


def test_chunks_cover_every_word(monkeypatch):
    import align.generation.fingerprint as fp

    t = torch.randn(1000)
    whole = int(checksum(t))
    monkeypatch.setattr(fp, "_CHUNK", 7)
    assert int(checksum(t)) == whole
    u = t.clone()
    u[-1] += 1
    assert int(checksum(u)) != whole


def test_fingerprint_names_shapes_dtypes_and_cast():
    a = {"w": torch.ones(2, 3), "b": torch.zeros(3)}
    same = fingerprint(a.items())
    assert fingerprint({k: v.clone() for k, v in a.items()}.items()) == same
    assert fingerprint({"w2": a["w"], "b": a["b"]}.items()) != same
    assert fingerprint({"w": a["w"].view(3, 2), "b": a["b"]}.items()) != same
    assert fingerprint(a.items(), torch.bfloat16) == fingerprint({k: v.bfloat16() for k, v in a.items()}.items())
    assert fingerprint(a.items(), torch.bfloat16) != same
