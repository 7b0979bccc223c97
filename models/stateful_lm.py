"""Recurrent language model for truncated BPTT: independent chunks or carried state.

Shapes: B = rows in the batch, M = ``max_batch_size``, C = time steps (a chunk), V = vocab,
H = ``units``.

Input batches are ``(features, targets)``:

- ``features``: ``{"ids": int32 [B, C], "ids_length": int32 [B]}`` and, for chunks from
  ``tfseq.tbptt_chunks`` / ``tfseq.tbptt_stream``, ``"resets": bool [B]`` and
  ``"chunk_index": int64 [B]``;
- ``targets``: int32 ``[B, C]``, the next token of each input step.

Steps at or past a row's ``ids_length`` are padding: they get loss weight 0, and the recurrent
layer holds the state there, so a row's final state is its state after its last real token.
A row with length 0 (its sequence has ended) contributes nothing.

Two variants (``carry_state``):

- ``False``, independent chunks: every chunk starts from the zero state. Chunks may then be in
  any order, but ``chunk_index`` is still checked when present (``check_order``).
- ``True``, carried state: the model keeps per-row state variables of shape ``[M, H]`` (two for
  an LSTM). A chunk of ``B <= M`` rows starts row ``b`` from ``resets[b] ? 0 : cache[b]`` and
  writes its final states back to rows ``[0, B)`` of the cache after the step (rows ``[B, M)``
  are left alone, so a smaller last batch works). Gradients stop at chunk boundaries.

Evaluation and prediction (``test_step``/``predict_step``) on chunks always carry the state,
in a cache of their own (whenever ``max_batch_size`` is given), whatever the training variant:
the perplexity on chunks is then exactly the whole-sequence one, at the memory of one chunk.
Whole sequences (no ``resets`` feature) always start from zero.

Order is checked in-graph on every ``train_step``/``test_step``/``predict_step`` that receives
``chunk_index``: the index must be the previous one plus 1, or 0 (a new pass, where every row
resets); otherwise the step fails with ``InvalidArgumentError`` ("tbptt chunks arrived out of
order ..."). XLA would drop that assertion, so ``jit_compile="auto"`` resolves to off while
``check_order`` is on.

Works with ``model.fit``, ``train_on_batch`` (``tfseq.training.Trainer``, whose checkpoints
then hold the caches and order counters, so a resumed run carries on mid-stream) and the
``mixed_float16`` policy (the cache and the loss stay float32; the optimizer is wrapped in a
``LossScaleOptimizer`` by ``compile``).
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfseq._common import LENGTH_SUFFIX
from tfseq.tbptt import CHUNK_INDEX, RESETS

CELLS = ("gru", "lstm")


@keras.saving.register_keras_serializable(package="tfseq")
class StatefulLM(keras.Model):
    """Embedding -> GRU/LSTM -> softmax over the vocabulary, with optional carried state.

    Args:
      vocab_size: V, the number of token ids (0 is padding).
      embedding_dim: embedding width.
      units: H, recurrent state width.
      cell: ``"gru"`` or ``"lstm"``.
      carry_state: carry each row's state across chunks (see the module docstring).
      max_batch_size: M, the most rows a batch can have (sizes the state caches); required
        when ``carry_state``; without it evaluation on chunks starts each chunk from zero.
      check_order: assert in-graph that chunks arrive in order.
      key: the input feature (``key`` and ``key + "_length"`` are read).
      **kwargs: passed to ``keras.Model`` (``name``, ``dtype``, ...).

    Raises:
      ValueError: an unknown ``cell``, a non-positive size, or ``carry_state`` without
        ``max_batch_size``.
    """

    def __init__(self, vocab_size: int, *, embedding_dim: int = 128, units: int = 256,
                 cell: str = "gru", carry_state: bool = True, max_batch_size: int | None = None,
                 check_order: bool = True, key: str = "ids", **kwargs):
        super().__init__(**kwargs)
        if cell not in CELLS:
            raise ValueError(f"Unknown cell {cell!r}; expected one of {CELLS}")
        for name, value in (("vocab_size", vocab_size), ("embedding_dim", embedding_dim),
                            ("units", units)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int; received {name}={value!r}")
        if carry_state and max_batch_size is None:
            raise ValueError("carry_state=True needs max_batch_size (a positive int) to size the "
                             "state cache; received max_batch_size=None")
        if max_batch_size is not None and (not isinstance(max_batch_size, int)
                                           or max_batch_size <= 0):
            raise ValueError("max_batch_size must be a positive int or None; received "
                             f"max_batch_size={max_batch_size!r}")
        self.vocab_size = vocab_size
        self.embedding_dim = embedding_dim
        self.units = units
        self.cell = cell
        self.carry_state = carry_state
        self.max_batch_size = max_batch_size
        self.check_order = check_order
        self.key = key
        policy = self.dtype_policy
        self.embedding = keras.layers.Embedding(vocab_size, embedding_dim, dtype=policy,
                                                name="embedding")
        rnn = keras.layers.GRU if cell == "gru" else keras.layers.LSTM
        self.rnn = rnn(units, return_sequences=True, return_state=True, dtype=policy, name=cell)
        self.head = keras.layers.Dense(vocab_size, dtype=policy, name="logits")
        num_states = 1 if cell == "gru" else 2
        # One attribute per variable: tf.train.Checkpoint (tfseq.training.Trainer) tracks
        # attributes, not variables inside dicts, and a resumed run needs the caches.
        self._caches = {}
        self._next_chunk = {}
        for mode, carry in (("train", carry_state), ("eval", max_batch_size is not None)):
            if carry:
                states = []
                for i in range(num_states):
                    var = self.add_weight(shape=(max_batch_size, units), initializer="zeros",
                                          dtype="float32", trainable=False,
                                          name=f"{mode}_state_{i}")
                    setattr(self, f"{mode}_state_{i}", var)
                    states.append(var)
                self._caches[mode] = states
            var = self.add_weight(shape=(), initializer="zeros", dtype="int64", trainable=False,
                                  name=f"{mode}_next_chunk")
            setattr(self, f"{mode}_next_chunk", var)
            self._next_chunk[mode] = var
        self._loss_tracker = keras.metrics.Mean(name="loss")
        self._tokens = keras.metrics.Sum(name="tokens")
        if check_order:
            self.supports_jit = False

    # -- forward -------------------------------------------------------------------------
    def zero_state(self, rows) -> list[tf.Tensor]:
        """The default (reset) state: zeros, float32 ``[rows, H]`` per state tensor."""
        num_states = 1 if self.cell == "gru" else 2
        return [tf.zeros([rows, self.units], tf.float32) for _ in range(num_states)]

    def run(self, features, initial_state=None, training=False):
        """Runs a batch from ``initial_state`` (default zeros).

        Args:
          features: ``{key: int [B, T], key_length: int [B]}`` (other keys ignored).
          initial_state: list of float ``[B, H]`` (one for a GRU, ``[h, c]`` for an LSTM).
          training: Keras training flag.

        Returns:
          ``(logits, states)``: float32 ``[B, T, V]`` and the list of float32 ``[B, H]`` states
          after each row's last real step.
        """
        ids = features[self.key]
        mask = tf.sequence_mask(features[self.key + LENGTH_SUFFIX], tf.shape(ids)[1])
        if initial_state is None:
            initial_state = self.zero_state(tf.shape(ids)[0])
        compute = self.dtype_policy.compute_dtype
        initial_state = [tf.cast(s, compute) for s in initial_state]
        x = self.embedding(ids)
        outputs = self.rnn(x, mask=mask, initial_state=initial_state, training=training)
        sequence, states = outputs[0], list(outputs[1:])
        logits = tf.cast(self.head(sequence), tf.float32)
        return logits, [tf.cast(s, tf.float32) for s in states]

    def call(self, inputs, training=False):
        """Logits float32 ``[B, T, V]`` from the zero state (whole sequences, no cache)."""
        logits, _ = self.run(inputs, training=training)
        return logits

    # -- state cache ---------------------------------------------------------------------
    def cached_state(self, mode: str = "train") -> list[tf.Tensor]:
        """The carried states, float32 ``[M, H]`` each; ``mode`` is ``"train"`` or ``"eval"``.

        Raises:
          KeyError: ``mode`` has no cache (``carry_state=False`` for ``"train"``, no
            ``max_batch_size`` for ``"eval"``).
        """
        return [tf.convert_to_tensor(v) for v in self._caches[mode]]

    def reset_states(self) -> None:
        """Zeroes every cache and order counter (a fresh start)."""
        for mode in ("train", "eval"):
            for v in self._caches.get(mode, []):
                v.assign(tf.zeros_like(v))
            self._next_chunk[mode].assign(0)

    def _check_features(self, features, training: bool) -> None:
        if not isinstance(features, dict):
            raise TypeError(f"StatefulLM expects dict features; received {type(features).__name__}")
        missing = [k for k in (self.key, self.key + LENGTH_SUFFIX) if k not in features]
        if missing:
            raise ValueError(f"StatefulLM needs features {missing}; received {sorted(features)}")
        if self.carry_state and training and not (RESETS in features and CHUNK_INDEX in features):
            raise ValueError(
                "carry_state=True trains on chunks from tfseq.tbptt_chunks or tfseq.tbptt_stream "
                f"(with '{RESETS}' and '{CHUNK_INDEX}'); received features {sorted(features)}")

    def _assert_in_order(self, chunk_index, mode: str):
        """Asserts the chunk follows the previous one (or restarts at 0); records it."""
        index = tf.reduce_max(tf.cast(chunk_index, tf.int64))
        counter = self._next_chunk[mode]
        expected = tf.convert_to_tensor(counter)
        ok = tf.logical_or(tf.equal(index, expected), tf.equal(index, 0))
        check = tf.debugging.Assert(ok, [
            "tbptt chunks arrived out of order (was the chunked dataset shuffled, interleaved or "
            f"skipped?) in {mode}: expected chunk_index", expected, "or 0, received", index])
        with tf.control_dependencies([check]):
            counter.assign(index + 1)

    def _initial_state(self, features, mode: str):
        """``(initial_state, commit)``: where a chunk starts, and how to save where it ended."""
        rows = tf.shape(features[self.key])[0]
        if self.check_order and CHUNK_INDEX in features:
            self._assert_in_order(features[CHUNK_INDEX], mode)
        if not (mode in self._caches and RESETS in features):
            return self.zero_state(rows), lambda states: None
        static_rows = features[self.key].shape[0]
        if static_rows is not None and static_rows > self.max_batch_size:
            raise ValueError(f"A batch of {static_rows} rows does not fit the state cache of "
                             f"max_batch_size={self.max_batch_size}")
        check = tf.debugging.assert_less_equal(
            rows, self.max_batch_size,
            message=f"a batch has more rows than max_batch_size={self.max_batch_size}")
        with tf.control_dependencies([check]):
            rows = tf.identity(rows)
        caches = self._caches[mode]
        resets = tf.cast(features[RESETS], tf.bool)[:, tf.newaxis]
        initial = [tf.where(resets, zero, tf.convert_to_tensor(cache)[:rows])
                   for zero, cache in zip(self.zero_state(rows), caches)]

        def commit(states):
            for cache, state in zip(caches, states):
                old = tf.convert_to_tensor(cache)
                cache.assign(tf.concat([tf.stop_gradient(state), old[rows:]], axis=0))

        return initial, commit

    # -- loss and steps ------------------------------------------------------------------
    def _nll(self, features, targets, logits):
        """Sum of token negative log-likelihoods (float32 scalar) and the number of tokens."""
        mask = tf.sequence_mask(features[self.key + LENGTH_SUFFIX], tf.shape(targets)[1],
                                dtype=tf.float32)
        nll = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.cast(targets, tf.int32), logits=logits)
        return tf.reduce_sum(nll * mask), tf.reduce_sum(mask)

    def _logs(self, total, count):
        self._loss_tracker.update_state(total / tf.maximum(count, 1.0), sample_weight=count)
        self._tokens.update_state(count)
        loss = self._loss_tracker.result()
        return {"loss": loss, "perplexity": tf.exp(loss), "tokens": self._tokens.result()}

    @property
    def metrics(self):
        return [self._loss_tracker, self._tokens]

    @staticmethod
    def _unpack(data):
        features, targets, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None:
            raise ValueError("StatefulLM weights tokens by ids_length; sample weights are not "
                             "supported")
        return features, targets

    def train_step(self, data):
        features, targets = self._unpack(data)
        self._check_features(features, training=True)
        initial, commit = self._initial_state(features, "train")
        with tf.GradientTape() as tape:
            logits, states = self.run(features, initial, training=True)
            total, count = self._nll(features, targets, logits)
            loss = total / tf.maximum(count, 1.0)
            scaled = self.optimizer.scale_loss(loss)
        variables = self.trainable_variables
        grads = tape.gradient(scaled, variables)
        self.optimizer.apply_gradients(zip(grads, variables))
        commit(states)
        return self._logs(total, count)

    def test_step(self, data):
        features, targets = self._unpack(data)
        self._check_features(features, training=False)
        initial, commit = self._initial_state(features, "eval")
        logits, states = self.run(features, initial, training=False)
        commit(states)
        return self._logs(*self._nll(features, targets, logits))

    def predict_step(self, data):
        features, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        self._check_features(features, training=False)
        initial, commit = self._initial_state(features, "eval")
        logits, states = self.run(features, initial, training=False)
        commit(states)
        return logits

    def compile(self, *args, jit_compile="auto", **kwargs):
        if jit_compile is True and self.check_order:
            raise ValueError("jit_compile=True would drop the chunk-order assertion (XLA ignores "
                             "tf.debugging.Assert); pass check_order=False to the model to use XLA")
        super().compile(*args, jit_compile=jit_compile, **kwargs)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, embedding_dim=self.embedding_dim,
                      units=self.units, cell=self.cell, carry_state=self.carry_state,
                      max_batch_size=self.max_batch_size, check_order=self.check_order,
                      key=self.key)
        return config


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 128
    units: int = 256
    cell: str = "gru"
    learning_rate: float = 3e-3
    clipnorm: float = 1.0


def build_model(config, info, model_config: ModelConfig = ModelConfig()) -> StatefulLM:
    """A compiled ``StatefulLM`` for the ``lm_tbptt`` pipeline.

    Args:
      config: the pipeline's ``Config`` (reads ``carry_state``, ``tbptt``, ``batch_size``).
      info: the pipeline's ``info`` (reads ``vocab_size``).
      model_config: model sizes and optimizer settings.

    Returns:
      A ``StatefulLM`` compiled with Adam (gradient norm clipped). The state is carried only
      when ``config.tbptt`` is set and ``config.carry_state`` is true.
    """
    model = StatefulLM(
        info["vocab_size"], embedding_dim=model_config.embedding_dim, units=model_config.units,
        cell=model_config.cell, carry_state=bool(config.tbptt and config.carry_state),
        max_batch_size=config.batch_size, name="stateful_lm")
    model.compile(optimizer=keras.optimizers.Adam(model_config.learning_rate,
                                                  clipnorm=model_config.clipnorm))
    return model
