"""tfseq: variable-length sequences into TensorFlow models, fast and exactly once.

Every transformation returns a ``dataset -> dataset`` function for ``Dataset.apply``.
"""

import os as _os

__version__ = "0.1.0"

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfseq._quiet import import_tensorflow as _import_tensorflow

_import_tensorflow()  # without TensorFlow's start-up lines (tfseq/_quiet.py)

from tfseq._common import trace_own_functions_as_written as _trace_own_functions_as_written

_trace_own_functions_as_written()  # AutoGraph leaves tfseq's functions as written


# --- foundation: reading, vocab, tokenizing, filtering, padding, stats
from tfseq.reading import text_lines
from tfseq import shuffling
from tfseq.text import Vocab, tokenize
from tfseq.filtering import filter_by_length, filter_lines
from tfseq.batching import Batching, pad_batch  # Batching: the pad | bucket | pack seam
from tfseq._common import pipeline_options, unbatch
from tfseq.stats import BatchStats, DropCounter, default_counter, step_efficiency
from tfseq.corpus import corpus_path
from tfseq import formats  # user files: tsv / csv / text / conll / jsonl / tfrecord / parquet rows
from tfseq.sampling import Reservoir
from tfseq.model_inputs import ModelFeatures

# --- mixtures of several sources
from tfseq.mixing import Mixture, mix

# --- bucketing
from tfseq.bucketing import bucket_by_length, fit_boundaries
from tfseq.inference import predict_in_order, restore_order, with_index

# --- packing
from tfseq.packing import pack, unpack
from tfseq.packed_targets import lm_targets, packed_weights

# --- splitting and distribution
from tfseq import distribute
from tfseq.distribute import GlobalWeightedLoss, global_weighted_mean, replica_dataset_fn
from tfseq.distribute import mirrored_strategy, to_replicas, use_data_service
from tfseq.splitting import prefetch_to_device, split, split_batch

# --- resumable training input and the training loop
from tfseq.resumable import RecordShards, ResumableStream
from tfseq import training

# --- tbptt
from tfseq.tbptt import assert_chunks_in_order, tbptt_chunks, tbptt_stream

# --- lod and multislot
from tfseq import lod

# --- serving (raw-text SavedModels)
from tfseq import serving

# --- layers
from tfseq import layers
from tfseq.layers.masked_softmax import masked_softmax


def __getattr__(name):
    """``tfseq.training_pipeline``: the task layer's one call for ``model.fit``
    (``tfseq.pipelines.fit``), imported when first used so that no library module imports
    the task layer. ``tfseq.keras_hub``: KerasHub models fed by tfseq (needs the
    ``keras-hub`` extra, imported on first use)."""
    if name == "training_pipeline":
        from tfseq.pipelines.fit import training_pipeline

        return training_pipeline
    if name == "keras_hub":
        import importlib

        return importlib.import_module("tfseq.keras_hub")
    raise AttributeError(f"module 'tfseq' has no attribute {name!r}")
