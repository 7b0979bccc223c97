"""Progress lines for the long phases before training: reading, spilling, learning a vocabulary.

A ``Progress`` writes a line at most every ``every`` seconds with the count so far, the rate and,
when the total is known, the percentage and an estimate of the time left; ``finish`` writes one
line with the totals. ``heartbeat`` covers a phase that reports nothing while it runs (a
vocabulary learner): a line every ``every`` seconds with the time spent. Lines go to the
``write`` callable given (the binaries pass one that prints to stderr unless ``--verbose=0``);
``write=None`` is silent, so the library prints nothing by itself::

    reading training records: 1,234,567 records, 120.3 of 187.0 MB (64%), 40.1 MB/s, ~2 s left
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable, Iterator

Write = Callable[[str], None]
# Seconds between lines; the environment variable TFSEQ_PROGRESS_SECONDS overrides it (tests
# set 0 to see every line on a tiny input).
EVERY = float(os.environ.get("TFSEQ_PROGRESS_SECONDS", 2.0))


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """Rate-limited progress lines for one phase.

    Args:
      what: the phase, e.g. ``"reading training records"``.
      write: where lines go (``None``: nowhere).
      total_bytes: the input's size in bytes, if known (for a percentage and a time left).
      every: seconds between lines.
    """

    def __init__(self, what: str, write: Write | None, *, total_bytes: float | None = None,
                 every: float | None = None):
        self.what = what
        self.write = write
        self.total_bytes = total_bytes
        self.every = EVERY if every is None else every
        self.start = time.perf_counter()
        self.last = self.start
        self.count = 0
        self.bytes = 0
        self.lines_written = 0

    def update(self, count: int = 0, num_bytes: int = 0) -> None:
        """Adds ``count`` records (and ``num_bytes`` of input) and writes a line if it is
        time."""
        self.count += count
        self.bytes += num_bytes
        now = time.perf_counter()
        if self.write is not None and now - self.last >= self.every:
            self.last = now
            self._emit(now, final=False)

    def finish(self) -> float:
        """Writes the closing line (if the phase took ``every`` seconds or more, or wrote a
        line already); returns the phase's seconds."""
        now = time.perf_counter()
        if self.write is not None and (self.lines_written or now - self.start >= self.every):
            self._emit(now, final=True)
        return now - self.start

    def _emit(self, now: float, final: bool) -> None:
        seconds = max(now - self.start, 1e-9)
        parts = [f"{self.count:,} records"]
        if self.bytes:
            mb = self.bytes / 1e6
            if self.total_bytes and not final:
                parts.append(f"{mb:,.1f} of {self.total_bytes / 1e6:,.1f} MB "
                             f"({min(100.0, 100 * self.bytes / self.total_bytes):.0f}%)")
            else:
                parts.append(f"{mb:,.1f} MB")
            parts.append(f"{mb / seconds:,.1f} MB/s")
            if self.total_bytes and not final and self.bytes < self.total_bytes:
                left = (self.total_bytes - self.bytes) / (self.bytes / seconds)
                parts.append(f"~{_duration(left)} left")
        else:
            parts.append(f"{self.count / seconds:,.0f} records/s")
        suffix = f" in {_duration(seconds)}" if final else ""
        self.write(f"{self.what}: {', '.join(parts)}{suffix}")
        self.lines_written += 1


@contextlib.contextmanager
def heartbeat(what: str, write: Write | None, *, every: float | None = None) -> Iterator[None]:
    """Writes ``"<what>: 12 s so far"`` every ``every`` seconds while the block runs (from a
    daemon thread), then ``"<what>: done in 31 s"``."""
    if write is None:
        yield
        return
    every = max(EVERY, 0.1) if every is None else every
    start = time.perf_counter()
    stop = threading.Event()

    def beat():
        while not stop.wait(every):
            write(f"{what}: {_duration(time.perf_counter() - start)} so far")

    write(f"{what} ...")
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    write(f"{what}: done in {_duration(time.perf_counter() - start)}")
