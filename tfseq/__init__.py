"""tfseq: variable-length sequences into TensorFlow models, fast and exactly once.

Every transformation returns a ``dataset -> dataset`` function for ``Dataset.apply``.
"""

import os as _os

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# --- foundation: reading, vocab, tokenizing, filtering, padding, stats
from tfseq.reading import text_lines
from tfseq.text import Vocab, tokenize
from tfseq.filtering import filter_by_length, filter_lines
from tfseq.batching import pad_batch
from tfseq.stats import BatchStats, DropCounter, default_counter, step_efficiency
from tfseq.corpus import corpus_path

# --- bucketing

# --- packing

# --- splitting and distribution

# --- tbptt
from tfseq.tbptt import assert_chunks_in_order, tbptt_chunks, tbptt_stream

# --- lod and multislot

# --- layers
from tfseq import layers
from tfseq.layers.masked_softmax import masked_softmax
