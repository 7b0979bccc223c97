"""A uniform, bounded, deterministic sample of the lines of a stream (reservoir sampling).

Shapes: n = lines in one ``add`` call, k = ``capacity``.

``Reservoir(k, seed)`` keeps at most k lines of a stream of any length read once, each line of
the stream equally likely to be kept (probability k / seen). It is Algorithm R (Vitter, 1985)
run on whole batches with numpy: line i of the stream (0-based) draws one uniform double u_i
and, once the reservoir is full, replaces slot floor(u_i * (i + 1)) when that is below k. A
batch costs a few numpy operations over its n lines, and no Python work per line except
turning a list into an array. One double is drawn per line past the first k, in stream order,
so the sample depends on the seed and the lines only, not on how the stream is cut into
batches::

    Reservoir(3, seed=0), lines added         kept after the call
    add(["a", "b"])                           ["a", "b"]                (filling)
    add(["c", "d", "e", "f"])                 3 of a..f, each with probability 3/6

``sample()`` returns the kept lines in stream order.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class Reservoir:
    """A uniform sample of at most ``capacity`` lines of a stream, fed in batches.

    Args:
      capacity: k, the most lines kept (>= 1).
      seed: seed of the random draws; the same seed and the same lines give the same sample,
        however the lines are cut into batches.

    Raises:
      TypeError: ``capacity`` or ``seed`` is not an int.
      ValueError: ``capacity`` < 1.

    Example:
      >>> reservoir = Reservoir(2, seed=0)
      >>> reservoir.add([b"a", b"b", b"c"]); reservoir.add(np.array([b"d"], dtype=object))
      >>> reservoir.seen, len(reservoir.sample())
      (4, 2)
    """

    def __init__(self, capacity: int, seed: int = 0):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise TypeError(f"Reservoir capacity must be an int; received {capacity!r}")
        if capacity < 1:
            raise ValueError(f"Reservoir capacity must be >= 1; received capacity={capacity}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"Reservoir seed must be an int; received {seed!r}")
        self.capacity = int(capacity)
        self.seed = int(seed)
        self.seen = 0
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._lines = np.empty(self.capacity, dtype=object)
        self._positions = np.zeros(self.capacity, dtype=np.int64)  # stream index of each slot
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, batch: np.ndarray | Sequence[bytes | str]) -> None:
        """Offers the next lines of the stream.

        Args:
          batch: ``[n]`` lines: a 1-D numpy array (``object`` dtype of ``bytes``/``str``, as
            ``Dataset.as_numpy_iterator`` gives for ``tf.string``, or a fixed-width ``S``/``U``
            dtype), or a list/tuple of ``bytes``/``str``. Lines are kept as given.

        Raises:
          ValueError: ``batch`` is not 1-D (the message gives its shape).
        """
        lines = _as_lines(batch)
        n = len(lines)
        if n == 0:
            return
        fill = min(n, self.capacity - self._size)
        if fill:
            self._lines[self._size:self._size + fill] = lines[:fill]
            self._positions[self._size:self._size + fill] = self.seen + np.arange(fill)
            self._size += fill
        if fill < n:
            self._replace(lines[fill:], self.seen + fill)
        self.seen += n

    def _replace(self, lines: np.ndarray, first: int) -> None:
        """Algorithm R's step for stream lines ``first .. first + m - 1`` (reservoir full)."""
        positions = first + np.arange(len(lines), dtype=np.int64)
        u = self._rng.random(len(lines))
        # floor(u * (i + 1)) is uniform on 0..i; the minimum guards the rounding of u * (i + 1)
        # up to i + 1 (u < 1, but the product is rounded).
        slots = np.minimum((u * (positions + 1)).astype(np.int64), positions)
        hit = np.flatnonzero(slots < self.capacity)
        if not len(hit):
            return
        # Several lines of one batch may draw the same slot: as in the line-by-line algorithm
        # the last of them wins, i.e. the first in reverse order.
        reversed_hit = hit[::-1]
        slot_values, first_in_reversed = np.unique(slots[reversed_hit], return_index=True)
        winners = reversed_hit[first_in_reversed]
        self._lines[slot_values] = lines[winners]
        self._positions[slot_values] = positions[winners]

    def sample(self) -> list:
        """The kept lines, ``min(seen, capacity)`` of them, in stream order (as added: ``bytes``
        or ``str``)."""
        order = np.argsort(self._positions[:self._size], kind="stable")
        return self._lines[:self._size][order].tolist()


def _as_lines(batch) -> np.ndarray:
    """``batch`` -> a 1-D ``object`` array of its lines (no copy for an ``object`` array)."""
    if isinstance(batch, np.ndarray):
        if batch.ndim != 1:
            raise ValueError(f"Reservoir.add takes a 1-D batch of lines; received an array of "
                             f"shape {batch.shape}")
        return batch if batch.dtype == object else batch.astype(object)
    if isinstance(batch, (str, bytes)):
        raise ValueError(f"Reservoir.add takes a batch of lines (a list or 1-D array), not one "
                         f"line; received {batch[:40]!r}")
    lines = np.empty(len(batch), dtype=object)
    lines[:] = batch
    return lines
