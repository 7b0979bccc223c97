"""tfseq: variable-length sequences into TensorFlow models, fast and exactly once.

Every transformation returns a ``dataset -> dataset`` function for ``Dataset.apply``.
"""

import os as _os

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _map_checkout_packages() -> None:
    """In a source checkout the repository's top-level ``pipelines/``, ``models/`` and
    ``scripts/`` are ``tfseq.pipelines``, ``tfseq.models`` and ``tfseq.scripts``, as in the
    installed wheel (``setup.py`` maps them there). Nothing to do when installed."""
    import importlib.util
    import sys

    here = _os.path.dirname(_os.path.abspath(__file__))
    root = _os.path.dirname(here)
    for name in ("pipelines", "models", "scripts"):
        if f"{__name__}.{name}" in sys.modules or _os.path.isdir(_os.path.join(here, name)):
            continue
        init = _os.path.join(root, name, "__init__.py")
        if not _os.path.isfile(init):
            continue
        spec = importlib.util.spec_from_file_location(
            f"{__name__}.{name}", init, submodule_search_locations=[_os.path.dirname(init)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        globals()[name] = module


_map_checkout_packages()

# --- foundation: reading, vocab, tokenizing, filtering, padding, stats
from tfseq.reading import text_lines
from tfseq import shuffling
from tfseq.text import Vocab, tokenize
from tfseq.filtering import filter_by_length, filter_lines
from tfseq.batching import Batching, pad_batch  # Batching: the pad | bucket | pack seam
from tfseq._common import pipeline_options, unbatch
from tfseq.stats import BatchStats, DropCounter, default_counter, step_efficiency
from tfseq.corpus import corpus_path
from tfseq import formats  # user files: tsv / csv / text / conll rows with named columns
from tfseq.sampling import Reservoir
from tfseq.model_inputs import ModelFeatures
from tfseq.pipeline import training_pipeline

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
