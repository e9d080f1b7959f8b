"""The trace's string columns: strings held as one blob and made when read (`IndexedStrings`, `Strings`),
and block names coded in the order first named, by hash, a batch at a time (`BlockCoder`)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import overload

import numpy as np
import numpy.typing as npt

__all__ = ["BlockCoder", "IndexedStrings", "Int64Array", "Int32Array", "Strings"]

Int64Array = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]  # token counts, turns, codes: 4 bytes a request


class IndexedStrings(Sequence[str]):
    """A sequence of strings each made when it is read, by `_item(index)` (index within range)."""

    __slots__ = ()

    def _item(self, index: int) -> str:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._item(index)


class Strings(IndexedStrings):
    """Strings held as one UTF-8 blob and where each ends: about 12 bytes a string besides its text,
    where a list of Python strings takes 57 (a million request ids: 19 MB, not 64)."""

    __slots__ = ("_blob", "_ends")

    def __init__(self, blob: bytes | bytearray, ends: Int64Array) -> None:
        self._blob, self._ends = blob, ends

    def __len__(self) -> int:
        return len(self._ends)

    def _item(self, index: int) -> str:
        start = int(self._ends[index - 1]) if index > 0 else 0
        return self._blob[start : int(self._ends[index])].decode()

    def spans(self, first: int, stop: int) -> list[str]:
        """Strings first to stop - 1, decoded in one go."""
        ends = self._ends[first:stop].tolist()
        start = int(self._ends[first - 1]) if first > 0 else 0
        out = []
        for end in ends:
            out.append(self._blob[start:end].decode())
            start = end
        return out

    def take(self, indices: Int64Array) -> Strings:
        ends, blob = self._ends.tolist(), self._blob
        pieces = [blob[(ends[i - 1] if i else 0) : ends[i]] for i in indices.tolist()]
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        return Strings(b"".join(pieces), np.cumsum(lengths))


class BlockCoder:
    """Block names coded in the order they are first named, in about 35 bytes a distinct block: a day of a
    Mooncake trace names millions of shared blocks, and a dict of their names took 160 bytes each (a
    million-request trace: 700 MB). Each name is keyed by 96 bits of two independent hashes (a collision
    among ten million names: about 1 in 10**15); the keys are kept by code, with the codes in the keys'
    order beside them, so that names are coded a batch at a time by binary search (numpy); a new key costs
    16 bytes, and a batch with new keys copies the 4-byte codes in key order once (`np.insert`); each
    distinct name's text is kept once, in a blob."""

    BATCH = 1 << 16  # uses coded at once: about 150 bytes each meanwhile (their names, the sort), 10 MB

    def __init__(self) -> None:
        self._keys_a, self._keys_b = array("q"), array("i")  # by code
        self._by_key = np.zeros(0, np.int32)  # the codes in the order of their first keys
        self.names_blob, self.names_ends = bytearray(), array("q")
        self.pending: list[str] = []

    def code(self) -> tuple[Int32Array, Int64Array]:
        """The pending names' codes, in order, and where in the batch each new code was first used: names
        never seen before get the next codes, in the order they were first named."""
        names, self.pending = self.pending, []
        keys_a = np.fromiter((hash(name) for name in names), np.int64, count=len(names))
        keys_b = np.fromiter((hash(name + "\x00") for name in names), np.int64, count=len(names)).astype(np.int32)
        order = np.lexsort((keys_b, keys_a))  # stable: a group's first element is its first use
        sorted_a, sorted_b = keys_a[order], keys_b[order]
        starts = np.ones(len(order), bool)
        starts[1:] = (sorted_a[1:] != sorted_a[:-1]) | (sorted_b[1:] != sorted_b[:-1])
        group = np.cumsum(starts) - 1
        inverse = np.empty(len(order), np.int64)
        inverse[order] = group
        first = order[starts]
        unique_a, unique_b = sorted_a[starts], sorted_b[starts]
        group_codes = self._known(unique_a, unique_b)
        new = np.flatnonzero(group_codes < 0)
        new = new[np.argsort(first[new], kind="stable")]  # in the order first named
        count = len(self._keys_a)
        group_codes[new] = np.arange(count, count + len(new), dtype=np.int32)
        by_key = new[np.argsort(unique_a[new], kind="stable")]
        at = np.searchsorted(np.frombuffer(self._keys_a, np.int64), unique_a[by_key], sorter=self._by_key)
        self._by_key = np.insert(self._by_key, at, group_codes[by_key])
        self._keys_a.frombytes(unique_a[new].tobytes())
        self._keys_b.frombytes(unique_b[new].tobytes())
        for position in first[new].tolist():
            self.names_blob += names[position].encode()
            self.names_ends.append(len(self.names_blob))
        return group_codes[inverse], first[new]

    def _known(self, unique_a: Int64Array, unique_b: Int32Array) -> Int32Array:
        """The code of each key seen before, -1 for a new one."""
        codes = np.full(len(unique_a), -1, np.int32)
        if not len(self._by_key):
            return codes
        keys_a, keys_b = np.frombuffer(self._keys_a, np.int64), np.frombuffer(self._keys_b, np.int32)
        low = np.searchsorted(keys_a, unique_a, "left", sorter=self._by_key)
        high = np.searchsorted(keys_a, unique_a, "right", sorter=self._by_key)
        one = np.flatnonzero(high - low == 1)
        candidates = self._by_key[low[one]]
        hit = keys_b[candidates] == unique_b[one]
        codes[one[hit]] = candidates[hit]
        for index in np.flatnonzero(high - low > 1).tolist():  # first halves equal: next to never
            run = self._by_key[int(low[index]) : int(high[index])].tolist()
            codes[index] = next((code for code in run if keys_b[code] == unique_b[index]), -1)
        return codes
