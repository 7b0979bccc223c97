"""KerasHub models fed by tfseq: a KerasHub tokenizer as a pipeline step, and tfseq batches
as a KerasHub backbone's or task's inputs.

Shapes: B = batch (rows), T = the longest example of the batch.

KerasHub's preprocessors pad every example to one ``sequence_length`` (512 for
``TextClassifierPreprocessor``), so 30-token sentences train as 512-token rows. Its text
backbones take any length (``token_ids``, ``padding_mask``, ``segment_ids``: ``[B, None]``),
so tfseq's length-bucketed batches (``tfseq.bucket_by_length(max_tokens=...)``: little
padding, shuffled, every example exactly once) feed them as they are::

    lines ─ tokenize(tokenizer) ─> {"ids": int32 [n, (T)]} ─ bucket_by_length(max_tokens=4096)
          ─> {"ids": [B, T], "ids_length": [B], "label": [B]} ─ inputs(classifier)
          ─> ({"token_ids": [B, T], "padding_mask": [B, T], "segment_ids": [B, T]}, label)

Which batching each model family takes (checked on KerasHub 0.32):

- Encoders and classifiers (BERT, RoBERTa, ALBERT, DistilBERT, DeBERTaV3, ELECTRA, XLM-R,
  ...; their ``TextClassifier``s): ``bucket_by_length`` under a token budget, or ``pad_batch``.
  Attention masks padding with ``padding_mask``, so an example's outputs at its tokens are
  the same in a bucketed batch as padded to any length (``tests/test_keras_hub.py`` checks
  it against KerasHub's own preprocessor). Examples must fit the position embedding
  (``max_sequence_length``): cut them with ``tokenize(sequence_length=...)`` or drop them
  with ``bucket_by_length(max_length=...)``.
- Causal LMs (GPT-2, Llama, Gemma, Mistral, ...; their ``CausalLM``s): ``bucket_by_length``.
  Not ``pack``: their backbones take a ``[B, T]`` padding mask only and build the causal mask
  inside, with positions counted from each row's start; no text backbone takes attention
  segments or a 2-D mask (BERT's ``segment_ids`` are sentence A/B embeddings), so packed
  examples would attend to each other. ``inputs`` refuses packed batches.
- Backbones without a ``padding_mask`` input (FNet mixes the whole padded row with a Fourier
  transform) change their output with the padded length, so they only take one fixed
  padding: ``inputs`` refuses them; use KerasHub's preprocessor.
- Seq2seq (BART, T5) and masked LM tasks take other inputs (``encoder_token_ids``,
  ``mask_positions``): ``tokenize`` works for them, ``inputs`` says which input it lacks.

Example (the whole of it runs in ``docs/keras_hub.md``)::

    classifier = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None)
    rows = tf.data.Dataset.from_tensor_slices({"ids": texts, "label": labels}).shuffle(...)
    train = (rows.batch(1024)
             .apply(tfseq.keras_hub.tokenize(tokenizer))     # {"ids": [n, (T)], "label": [n]}
             .apply(tfseq.bucket_by_length(max_tokens=4096, max_length=512, seed=0))
             .apply(tfseq.keras_hub.inputs(classifier, batch_size=32)))
    classifier.fit(train, epochs=3)

The same pieces serve ``tfseq-train --task=classify --keras_hub=PATH``
(``pipelines/keras_hub_classify.py``): ``token_ids`` (the tokenization of ``tokenize``) encodes
its examples, ``backbone_inputs`` (the mapping of ``inputs``) feeds its model, and ``Encoder``
puts the tokenizer in its export.

``import tfseq`` does not import KerasHub; this module imports it on first use and, when it
is missing, raises ``ImportError`` saying how to install it (``pip install tfseq[keras-hub]``).
"""

from __future__ import annotations

import tensorflow as tf

from tfseq._common import LENGTH_SUFFIX, Transform, check_positive_int, mask_batch, unbatch
from tfseq.stats import DropCounter, resolve_counter

MISSING = "tfseq.keras_hub needs KerasHub: pip install tfseq[keras-hub]"

# The backbone inputs that a tfseq batch fills, each from the ids and their lengths.
FILLED = ("token_ids", "padding_mask", "segment_ids", "position_ids")
_SEGMENT_SUFFIX = "_segment_ids"


def keras_hub_module():
    """The ``keras_hub`` module, or ``ImportError`` naming the extra that installs it."""
    try:
        import keras_hub
    except ImportError:
        raise ImportError(MISSING) from None
    return keras_hub


# --------------------------------------------------------------------------- tokenize

def special_ids(tokenizer, start_end: bool = True) -> tuple[int | None, int | None, object]:
    """``(start id, end id, tokenizer)``: the tokens a model's preprocessor puts around one
    segment, and the KerasHub tokenizer to use.

    A ``Preprocessor`` (e.g. ``BertTextClassifierPreprocessor``, ``GPT2CausalLMPreprocessor``)
    gives its tokenizer and its own choice: ``add_start_token``/``add_end_token`` where it has
    them (causal LMs), else start and end (``TextClassifierPreprocessor``'s
    ``MultiSegmentPacker``: ``[CLS] ... [SEP]``). A ``Tokenizer`` gives its
    ``start_token_id``/``end_token_id`` (``None`` where it has none). ``start_end=False``:
    neither.

    Raises:
      TypeError: ``tokenizer`` is neither a KerasHub ``Tokenizer`` nor a ``Preprocessor`` with
        one.
      ValueError: the tokenizer pads to a fixed ``sequence_length`` (build it without).
    """
    keras_hub = keras_hub_module()
    add_start = add_end = bool(start_end)
    if isinstance(tokenizer, keras_hub.models.Preprocessor):
        preprocessor, tokenizer = tokenizer, tokenizer.tokenizer
        add_start = add_start and bool(getattr(preprocessor, "add_start_token", True))
        add_end = add_end and bool(getattr(preprocessor, "add_end_token", True))
    if not isinstance(tokenizer, keras_hub.tokenizers.Tokenizer):
        raise TypeError("tfseq.keras_hub.tokenize needs a keras_hub Tokenizer (or a "
                        f"Preprocessor with one); received {type(tokenizer).__name__}")
    if getattr(tokenizer, "sequence_length", None):
        raise ValueError(f"{type(tokenizer).__name__} pads to sequence_length="
                         f"{tokenizer.sequence_length}; build it without sequence_length "
                         "(tfseq batches by length)")
    start = getattr(tokenizer, "start_token_id", None) if add_start else None
    end = getattr(tokenizer, "end_token_id", None) if add_end else None
    return start, end, tokenizer


def tokenize(tokenizer, *, start_end: bool = True, sequence_length: int | None = None,
             key: str = "ids", counter: DropCounter | None = None, batch_size: int = 512,
             num_parallel_calls: int | None = None) -> Transform:
    """Transformation: text -> int32 ids with a KerasHub tokenizer, in the tf.data graph.

    Like ``tfseq.tokenize``: ``tf.string`` scalars become examples ``{key: int32 [(T)]}``;
    ``[n]`` batches of lines (what tfseq's readers hand out) become ragged batches
    ``{key: int32 [n, (T)]}``; dict elements have their ``key`` feature (scalar or ``[n]``)
    replaced by its ids, the other features kept. Lines with no token are dropped and counted
    under ``"empty"``.

    Ids are the tokenizer's, with the start/end tokens around them as the model's
    preprocessor adds them (``special_ids``): ``"The fox."`` -> ``[CLS] the fox . [SEP]``
    for BERT, ``<|endoftext|> The fox. <|endoftext|>`` for a GPT-2 causal LM. Some
    vocabularies give a real token id 0 (GPT-2's ``<|endoftext|>``): tfseq's batches carry
    lengths, and ``inputs`` builds the mask from them, not from zeros.

    Args:
      tokenizer: a KerasHub ``Tokenizer`` (``WordPieceTokenizer``, ``BytePairTokenizer``,
        ``SentencePieceTokenizer``, a model's ``BertTokenizer``/``GPT2Tokenizer``/..., from a
        config or ``from_preset`` of local files), or a model ``Preprocessor`` holding one (its
        start/end convention is then used).
      start_end: add the start/end tokens as the preprocessor does; ``False``: ids only.
      sequence_length: keep at most this many ids per example, start/end included, cutting
        the text's ids as KerasHub's packers do (the end token stays last); each cut example
        is counted as ``seen`` ``"truncated"``. ``None``: no cut.
      key: the feature to write (string elements) or to tokenize (dict elements).
      counter: where drops are counted (default: ``tfseq.stats.default_counter()``).
      batch_size: lines tokenized per call when elements are single lines.
      num_parallel_calls: batches tokenized at once; default ``tf.data.AUTOTUNE``.

    Returns:
      A ``Dataset.apply`` transformation.

    Raises:
      ImportError: KerasHub is not installed.
      TypeError: ``tokenizer`` is not a KerasHub tokenizer or preprocessor.
      ValueError: the tokenizer pads to a fixed length; ``sequence_length`` leaves no room
        for a token; (when applied) elements that are not ``tf.string`` lines or dicts with a
        ``tf.string`` ``key``.

    Example:
      >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "fox", "."]
      >>> tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocab, lowercase=True)
      >>> ds = tf.data.Dataset.from_tensor_slices(["The fox.", ""])
      >>> [e["ids"].numpy().tolist() for e in ds.apply(tfseq.keras_hub.tokenize(tokenizer))]
      [[2, 5, 6, 7, 3]]
    """
    start, end, tok = special_ids(tokenizer, start_end)
    specials = (start is not None) + (end is not None)
    if sequence_length is not None and (isinstance(sequence_length, bool)
                                        or not isinstance(sequence_length, int)
                                        or sequence_length <= specials):
        raise ValueError(f"sequence_length must leave room for a token after the {specials} "
                         f"start/end tokens; received sequence_length={sequence_length!r}")
    counter = resolve_counter(counter)
    counter.register("empty")
    calls = tf.data.AUTOTUNE if num_parallel_calls is None else num_parallel_calls

    def to_ids(lines: tf.Tensor) -> tuple[tf.RaggedTensor, tf.Tensor]:
        """tf.string [B] -> (int32 RaggedTensor [B, (T)] with start/end, bool keep [B])."""
        ids, truncated = token_ids(tok, lines, start=start, end=end,
                                   sequence_length=sequence_length)
        keep = counter.keep_if({"empty": tf.equal(ids.row_lengths(), 0)})
        if sequence_length is None:
            return ids, keep
        with tf.control_dependencies([counter.note("truncated", tf.reduce_sum(
                tf.cast(truncated & keep, tf.int64)))]):
            return tf.identity(ids), keep

    def map_batch(batch):
        batch = dict(batch)
        batch[key], keep = to_ids(batch[key])
        return mask_batch(batch, keep)

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        spec = dataset.element_spec
        if isinstance(spec, tf.TensorSpec):
            if spec.dtype != tf.string or spec.shape.rank not in (0, 1):
                raise ValueError("tfseq.keras_hub.tokenize expects tf.string lines, [n] batches "
                                 f"of them, or dicts; received element_spec={spec}")
            dataset = dataset.map(lambda lines: {key: lines})
            spec = dataset.element_spec
        if not isinstance(spec, dict):
            raise ValueError("tfseq.keras_hub.tokenize expects tf.string lines or dicts; "
                             f"received element_spec={spec}")
        if key not in spec:
            raise ValueError(f"Unknown key {key!r} in tfseq.keras_hub.tokenize. Available "
                             f"keys: {sorted(spec)}")
        if (not isinstance(spec[key], tf.TensorSpec) or spec[key].dtype != tf.string
                or spec[key].shape.rank not in (0, 1)):
            raise ValueError(f"tfseq.keras_hub.tokenize(key={key!r}) needs a tf.string scalar "
                             f"(or [n] in batched dicts); received {spec[key]}")
        if spec[key].shape.rank == 1:  # batches in, ragged batches out
            return dataset.map(map_batch, num_parallel_calls=calls, deterministic=None)
        batched = dataset.batch(batch_size) if len(spec) == 1 else dataset.ragged_batch(batch_size)
        return unbatch(batched.map(map_batch, num_parallel_calls=calls, deterministic=None))

    return apply


def token_ids(tokenizer, lines: tf.Tensor, *, start: int | None = None,
              end: int | None = None, sequence_length: int | None = None
              ) -> tuple[tf.RaggedTensor, tf.Tensor]:
    """``tf.string [B]`` lines -> ``(ids int32 RaggedTensor [B, (T)], truncated bool [B])``.

    The ids of ``tokenizer`` (a KerasHub ``Tokenizer``) between ``start`` and ``end`` (ids,
    ``None``: none; ``special_ids`` gives a model's), cut to ``sequence_length`` ids in all
    as KerasHub's packers cut (the text's last ids go, the end token stays; ``truncated``
    says which rows were cut). A line with no token stays an empty row, without start or
    end. The one tokenization of ``tokenize``, of a task's examples and of its export.

    Example:
      >>> ids, cut = token_ids(tokenizer, tf.constant(["The fox.", ""]), start=2, end=3)
      >>> ids.to_list(), cut.numpy().tolist()
      ([[2, 5, 6, 7, 3], []], [False, False])
    """
    specials = (start is not None) + (end is not None)
    ids = tokenizer(lines)
    if not isinstance(ids, tf.RaggedTensor):  # a tokenizer that pads: no known lengths
        raise ValueError(f"{type(tokenizer).__name__} returned a dense {ids.shape} batch; "
                         "build it without sequence_length")
    ids = tf.cast(ids, tf.int32)
    truncated = tf.zeros([tf.shape(lines)[0]], tf.bool)
    if sequence_length is not None:
        room = sequence_length - specials
        truncated = ids.row_lengths() > room
        ids = ids[:, :room]
    has_tokens = ids.row_lengths() > 0
    rows = tf.shape(lines)[0]
    parts = [tf.RaggedTensor.from_tensor(tf.fill([rows, 1], value))
             for value in (start,) if value is not None]
    parts.append(ids)
    parts += [tf.RaggedTensor.from_tensor(tf.fill([rows, 1], value))
              for value in (end,) if value is not None]
    if len(parts) == 1:
        return ids, truncated
    ids = tf.concat(parts, axis=1)
    keep = tf.repeat(has_tokens, ids.row_lengths())
    return tf.ragged.boolean_mask(ids, ids.with_flat_values(keep)), truncated


class Encoder(tf.Module):
    """In-graph ``tf.string [B]`` -> ids with a KerasHub tokenizer, for an export: the same
    ids as ``tokenize`` (``token_ids``), from TensorFlow and tensorflow-text ops only, so the
    SavedModel loads without KerasHub.

    Args:
      tokenizer: a KerasHub ``Tokenizer`` or a ``Preprocessor`` holding one (``special_ids``).
      sequence_length: ids kept per line, start/end included (``None``: all).

    Call: ``text`` tf.string [B] -> ``(ids int32 RaggedTensor [B, (T)], truncated bool
    [B])``, as ``tfseq.serving.TextEncoder``.
    """

    def __init__(self, tokenizer, *, sequence_length: int | None = None):
        super().__init__()
        self.start, self.end, self.tokenizer = special_ids(tokenizer)
        self.sequence_length = sequence_length

    def __call__(self, text: tf.Tensor):
        return token_ids(self.tokenizer, text, start=self.start, end=self.end,
                         sequence_length=self.sequence_length)


# ----------------------------------------------------------------------------- inputs

def input_specs(model) -> dict:
    """``{name: dtype}`` of the inputs of ``model`` (a KerasHub ``Backbone``, or a ``Task``:
    its backbone's inputs plus its own, e.g. a masked LM's ``mask_positions``), read off its
    functional inputs.

    Raises:
      ValueError: the model's inputs are not a dict of named tensors.
    """
    try:
        structure = model.input
    except (AttributeError, ValueError):  # not a functional model
        structure = None
    if not isinstance(structure, dict):
        raise ValueError(f"{type(model).__name__} has no dict of named inputs (a KerasHub "
                         f"Backbone or Task has); received inputs {structure!r}")
    return {name: str(tensor.dtype) for name, tensor in structure.items()}


def backbone_inputs(dtypes: dict, ids: tf.Tensor, lengths: tf.Tensor) -> dict:
    """The inputs a KerasHub backbone declares (``dtypes``: ``input_specs``), each filled from
    ``ids`` int32 [B, T] (0-padded) and ``lengths`` [B] in its dtype: ``token_ids`` the
    ids, ``padding_mask`` true on each row's ``lengths`` first cells, ``segment_ids`` 0 (one
    text), ``position_ids`` 0 .. T-1. The one mapping of ``inputs`` and of a model that
    takes tfseq's padded batches (``tfseq.models.keras_hub_classifier``)."""
    mask = tf.sequence_mask(lengths, tf.shape(ids)[1])
    values = {"token_ids": lambda: ids, "padding_mask": lambda: mask,
              "segment_ids": lambda: tf.zeros_like(ids),
              "position_ids": lambda: tf.broadcast_to(tf.range(tf.shape(ids)[1]),
                                                      tf.shape(ids))}
    return {name: tf.cast(values[name](), dtype) for name, dtype in dtypes.items()}


def inputs(model, *, key: str = "ids", labels: bool = True, label_key: str = "label",
           weight_key: str = "weight", batch_size: int | None = None) -> Transform:
    """Transformation: tfseq batches -> what a KerasHub model takes, ready for ``model.fit``.

    Input batches are padded (``{key: [B, T], key_length: [B]}`` from ``bucket_by_length`` or
    ``pad_batch``) or ragged (``{key: [B, (T)]}``, ``pad_batch(ragged=True)``), optionally
    with ``label_key`` and ``weight_key`` ``[B]``. The model's backbone says which inputs it
    takes (``input_specs``); each is filled in the dtype it declares:

    ================  ======================================================================
    ``token_ids``     the ids (padding cells hold 0 and are masked)
    ``padding_mask``  true on the ``key_length`` real tokens of each row
    ``segment_ids``   0 everywhere (one segment: what the preprocessors give one text)
    ``position_ids``  0 .. T-1 on every row
    ================  ======================================================================

    With ``labels`` the elements are ``(x, y)`` or ``(x, y, sample_weight)``:

    - a ``CausalLM``: as ``CausalLMPreprocessor`` does, ``x`` holds ids ``[:, :-1]``, ``y``
      the ids ``[:, 1:]`` and ``sample_weight`` the padding mask ``[:, 1:]`` (float32, times
      the row's ``weight_key`` when there is one);
    - any other model (a ``TextClassifier``, a backbone under a head of your own): ``y`` is
      ``label_key``, ``sample_weight`` is ``weight_key`` when the batch has it, times
      ``rows / batch_size`` with ``batch_size``.

    Why ``batch_size``: Keras averages the loss over a batch's rows, so in a batch of ``n``
    rows each example weighs ``1/n``. Under a token budget long examples come in batches of
    few rows and weigh more (at ``max_tokens=1241``: 12 rows of 100-token texts, 124 rows of
    10-token ones), which skews a classifier towards what long examples say
    (``docs/keras_hub.md``). With ``batch_size=B`` every example weighs ``1/B``
    whatever its batch, as in fixed batches of ``B`` rows: give the mean rows per step.

    Without ``labels``: ``x`` alone (prediction, or a backbone's features).

    Args:
      model: a KerasHub ``Backbone`` or a ``Task`` holding one (``TextClassifier``,
        ``CausalLM``, ...), e.g. built with ``preprocessor=None``.
      key: the sequence feature holding the ids.
      labels: emit targets (and weights) with the inputs.
      label_key, weight_key: the batch features of the targets and per-row weights.
      batch_size: weigh every example the same across batches of different sizes (above);
        not for a ``CausalLM``, whose loss is averaged over its target cells, about
        ``max_tokens`` in every bucketed batch, so tokens already weigh alike.

    Returns:
      A ``Dataset.apply`` transformation.

    Raises:
      ImportError: KerasHub is not installed.
      ValueError: the backbone takes an input this does not fill (named, with what it
        fills), or no ``padding_mask`` (its output would change with the padded length);
        ``batch_size`` not a positive int, or given for a ``CausalLM``;
        (when applied) elements that are not padded or ragged batches with ``key`` (packed
        batches are refused: see the module docstring), or ``labels`` without ``label_key``.

    Example:
      >>> ds = ds.apply(tfseq.bucket_by_length(max_tokens=4096, seed=0))
      >>> classifier.fit(ds.apply(tfseq.keras_hub.inputs(classifier)), epochs=3)
    """
    keras_hub = keras_hub_module()
    dtypes = input_specs(model)
    backbone = getattr(model, "backbone", None)
    name = type(model if backbone is None else backbone).__name__
    unknown = sorted(set(dtypes) - set(FILLED))
    if unknown:
        raise ValueError(f"{name} takes inputs {sorted(dtypes)}; tfseq.keras_hub.inputs fills "
                         f"only {list(FILLED)} (text encoders, classifiers, causal LMs), not "
                         f"{unknown}")
    if "padding_mask" not in dtypes:
        raise ValueError(f"{name} takes no padding_mask, so its output changes with the padded "
                         "length: feed it KerasHub's preprocessor (one fixed sequence_length), "
                         "not variable-length batches")
    causal = isinstance(model, keras_hub.models.CausalLM)
    check_positive_int("batch_size", batch_size, allow_none=True)
    if causal and batch_size is not None:
        raise ValueError(f"inputs(batch_size={batch_size}) is for one loss per example; a "
                         f"{type(model).__name__} averages over its target tokens: leave it out")
    length_key = key + LENGTH_SUFFIX

    def to_model(batch):
        ids = batch[key]
        if isinstance(ids, tf.RaggedTensor):
            lengths, ids = ids.row_lengths(), ids.to_tensor(0)
        else:
            lengths = batch[length_key]
        if causal:
            mask = tf.sequence_mask(lengths, tf.shape(ids)[1])
            # inputs ids[:, :-1], their cells real where the row's are (mask[:, :-1])
            x = backbone_inputs(dtypes, ids[:, :-1],
                                tf.minimum(lengths, tf.cast(tf.shape(ids)[1] - 1,
                                                            lengths.dtype)))
        else:
            x = backbone_inputs(dtypes, ids, lengths)
        if not labels:
            return x
        if causal:
            weight = tf.cast(mask[:, 1:], tf.float32)
            if weight_key in batch:
                weight *= tf.cast(batch[weight_key], tf.float32)[:, None]
            return x, ids[:, 1:], weight
        weight = batch[weight_key] if weight_key in batch else None
        if batch_size is not None:
            rows = tf.cast(tf.shape(ids)[0], tf.float32) / batch_size
            weight = rows * (tf.ones_like(lengths, tf.float32) if weight is None
                             else tf.cast(weight, tf.float32))
        if weight is None:
            return x, batch[label_key]
        return x, batch[label_key], weight

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        spec = dataset.element_spec
        if not isinstance(spec, dict) or key not in spec:
            raise ValueError(f"tfseq.keras_hub.inputs needs dict batches with {key!r}; received "
                             f"element_spec={spec}")
        if key + _SEGMENT_SUFFIX in spec:
            raise ValueError(f"tfseq.keras_hub.inputs: packed batches ({key}{_SEGMENT_SUFFIX}) "
                             "would let examples attend to each other (KerasHub backbones take "
                             "a padding mask only); batch with tfseq.bucket_by_length or "
                             "pad_batch")
        ragged = isinstance(spec[key], tf.RaggedTensorSpec) and spec[key].shape.rank == 2
        padded = (isinstance(spec[key], tf.TensorSpec) and spec[key].shape.rank == 2
                  and length_key in spec)
        if not (ragged or padded):
            raise ValueError(f"tfseq.keras_hub.inputs needs batches: {key!r} [B, T] with "
                             f"{length_key!r} (bucket_by_length, pad_batch) or [B, (T)] "
                             f"(pad_batch(ragged=True)); received {key}: {spec[key]}")
        if labels and not causal and label_key not in spec:
            raise ValueError(f"tfseq.keras_hub.inputs(labels=True) needs {label_key!r} in the "
                             f"batch (or labels=False). Available keys: {sorted(spec)}")
        return dataset.map(to_model, num_parallel_calls=tf.data.AUTOTUNE, deterministic=None)

    return apply
