"""A feed timed at two pass lengths -> its steady rate and its start.

No flags here (unlike the bench scripts, which define absl flags once per process), so tests
can import it: ``scripts/bench_scaling.py --steady`` uses it.
"""

from __future__ import annotations


def steady(short, long) -> dict:
    """Two passes of one feed, ``(tokens, seconds)`` each, a short and a long one -> its rate
    once running (the tokens between them over the seconds between them) and its start (what
    the short pass took beyond its tokens at that rate: building the iterator's functions,
    filling the first pool or part)."""
    rate = (long[0] - short[0]) / max(long[1] - short[1], 1e-9)
    return {"short_real_tokens": short[0], "short_seconds": round(short[1], 4),
            "steady_tokens_per_second": rate,
            "start_seconds": round(short[1] - short[0] / rate, 4)}
