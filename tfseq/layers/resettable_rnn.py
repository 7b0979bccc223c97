"""An RNN that resets its state at each segment start: recurrent layers over packed rows.

Shapes: B = rows, T = time, D = input features, H = state units.

A packed row holds several examples one after the other (``tfseq.pack``). ``ResettableRNN``
runs a Keras RNN cell over the row and, at every step where ``resets`` is true, starts again
from the zero state, so each example sees exactly what it would see alone. Padding steps leave
the state untouched and output zeros, so the last state is the state after the row's last real
token: feeding it as ``initial_state`` to the next batch continues a split example (whose
continuation pieces have ``resets`` false) exactly as if it had not been split::

    ids          7  8  5  1  8  4  9  3  1  0
    resets       T  F  F  F  T  F  F  F  F  F
    state from   0  .  .  .  0  .  .  .  .  (kept)

``bidirectional=True`` adds a backward direction that reads each segment from its last token to
its first and restarts at every segment's end, so the concatenated output at each step equals a
bidirectional RNN run over that segment alone (a padded row is a packed row with one segment)::

    step         0  1  2  3  4  5  6  7  8  9
    segment ids  1  1  1  1  2  2  2  2  2  0
    forward      0  >  >  >  0  >  >  >  >  .     (zero state before steps 0 and 4: resets)
    backward     <  <  <  0  <  <  <  <  0  .     (zero state before steps 3 and 8: ends)

A backward direction cannot continue a split example into the next batch (it would need the
future), so ``bidirectional=True`` supports neither ``initial_state`` nor ``return_state``.
"""

from __future__ import annotations

import keras
import tensorflow as tf


class _ResetCell(keras.layers.Layer):
    """Wraps a cell; its step input is ``[x, reset, valid]`` concatenated on the last axis."""

    def __init__(self, cell, **kwargs):
        super().__init__(**kwargs)
        self.cell = cell

    @property
    def state_size(self):
        return self.cell.state_size

    @property
    def output_size(self):
        return getattr(self.cell, "output_size", None)

    def build(self, input_shape):
        if not self.cell.built:
            self.cell.build(tuple(input_shape[:-1]) + (input_shape[-1] - 2,))
        self.built = True

    def call(self, inputs, states, training=False):
        x = inputs[:, :-2]
        reset = inputs[:, -2:-1] > 0.5
        valid = inputs[:, -1:] > 0.5
        nested = isinstance(states, (list, tuple))
        old = list(states) if nested else [states]
        started = [tf.where(reset, tf.zeros_like(s), s) for s in old]
        output, new = self.cell(x, started if nested else started[0], training=training)
        new = list(new) if isinstance(new, (list, tuple)) else [new]
        new = [tf.where(valid, n, s) for n, s in zip(new, old)]
        output = tf.where(valid, output, tf.zeros_like(output))
        return output, new if nested else new[0]


@keras.saving.register_keras_serializable(package="tfseq")
class ResettableRNN(keras.layers.Layer):
    """Runs an RNN cell over packed rows, resetting the state where ``resets`` is true.

    Args:
      cell: a Keras RNN cell (``keras.layers.GRUCell(64)``, ``LSTMCell``, ``SimpleRNNCell``)
        or an RNN layer such as ``keras.layers.GRU(64)``, whose cell is used.
      return_sequences: return the outputs at every step ``[B, T, H]`` (default) rather than
        the last real step's ``[B, H]`` (the first final state, which is the output for the
        Keras GRU, LSTM and SimpleRNN cells).
      return_state: also return the final states (after each row's last real token).
      bidirectional: also run a backward copy of ``cell`` (its own weights) that restarts at
        each segment's end; the outputs of both directions are concatenated, ``[B, T, 2H]``.
        Needs ``return_sequences=True`` and ``return_state=False``.
      **kwargs: forwarded to ``keras.layers.Layer``.

    Call arguments:
      inputs: float ``[B, T, D]``.
      resets: bool ``[B, T]``, true where a segment starts (``"<name>_resets"`` of a packed
        batch); the state is set to zero before that step. ``None``: never reset.
      mask: bool ``[B, T]``, false on padding (e.g. ``segment_ids > 0``, or propagated from an
        ``Embedding(mask_zero=True)``); padding keeps the state and outputs zeros.
      initial_state: the state(s) to start from, e.g. the last state of the previous batch
        (a list, ``[h]`` for GRU, ``[h, c]`` for LSTM). Default zeros. Forward only.
      segment_ids: optional int ``[B, T]`` packed segment ids (1-based, 0 on padding). Fills
        in ``mask`` (``segment_ids > 0``) and ``resets`` (where the id changes) when they are
        ``None``, and marks the segment ends where the backward direction restarts. Without
        it a segment ends before a reset or a masked step, or at the row's end.
      training: forwarded to the cell (dropout).

    Returns:
      ``[B, T, H]`` (or ``[B, H]``), followed by the final states when ``return_state``.

    Example:
      >>> rnn = ResettableRNN(keras.layers.GRUCell(32))
      >>> y = rnn(embedded, batch["ids_resets"], mask=batch["ids_segment_ids"] > 0)
    """

    def __init__(self, cell, return_sequences: bool = True, return_state: bool = False,
                 bidirectional: bool = False, **kwargs):
        super().__init__(**kwargs)
        if bidirectional and (return_state or not return_sequences):
            raise ValueError(
                "ResettableRNN(bidirectional=True) returns sequences only; received "
                f"return_sequences={return_sequences!r}, return_state={return_state!r}")
        if isinstance(cell, dict):
            cell = keras.saving.deserialize_keras_object(cell)
        if isinstance(cell, keras.layers.RNN):
            cell = cell.cell
        if not hasattr(cell, "state_size"):
            raise TypeError(f"cell must be a Keras RNN cell or RNN layer; received cell={cell!r}")
        self.cell = cell
        self.return_sequences = return_sequences
        self.return_state = return_state
        self.supports_masking = True
        self._rnn = keras.layers.RNN(_ResetCell(cell), return_sequences=return_sequences,
                                     return_state=True)
        self.bidirectional = bool(bidirectional)
        self.backward_cell = None
        self._backward_rnn = None
        if self.bidirectional:
            config = cell.get_config()
            config["name"] = f"backward_{cell.name}"
            self.backward_cell = cell.__class__.from_config(config)
            self._backward_rnn = keras.layers.RNN(_ResetCell(self.backward_cell),
                                                  return_sequences=True, return_state=True)

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        self._built_input_shape = input_shape
        self._rnn.build(input_shape[:-1] + (input_shape[-1] + 2,))
        if self._backward_rnn is not None:
            self._backward_rnn.build(input_shape[:-1] + (input_shape[-1] + 2,))
        self.built = True

    def get_build_config(self):
        shape = getattr(self, "_built_input_shape", None)
        return None if shape is None else {"input_shape": shape}

    def build_from_config(self, config):
        if config and "input_shape" in config:
            self.build(config["input_shape"])

    def call(self, inputs, resets=None, mask=None, initial_state=None, training=None,
             segment_ids=None):
        shape = tf.shape(inputs)[:2]
        dtype = inputs.dtype
        if segment_ids is not None:
            segment_ids = tf.cast(segment_ids, tf.int32)
            in_segment = segment_ids > 0
            mask = in_segment if mask is None else tf.logical_and(tf.cast(mask, tf.bool),
                                                                  in_segment)
            if resets is None:
                previous = tf.pad(segment_ids[:, :-1], [[0, 0], [1, 0]])
                resets = tf.logical_and(in_segment, tf.not_equal(segment_ids, previous))
        valid = tf.ones(shape, tf.bool) if mask is None else tf.cast(mask, tf.bool)
        reset_steps = tf.zeros(shape, tf.bool) if resets is None else tf.cast(resets, tf.bool)
        steps = tf.concat([inputs, tf.cast(reset_steps, dtype)[..., None],
                           tf.cast(valid, dtype)[..., None]], axis=-1)
        cells = [self.cell] + ([self.backward_cell] if self.bidirectional else [])
        for cell in cells:
            for reset in ("reset_dropout_mask", "reset_recurrent_dropout_mask"):
                if hasattr(cell, reset):
                    getattr(cell, reset)()
        if initial_state is not None and not isinstance(initial_state, (list, tuple)):
            initial_state = [initial_state]
        if self.bidirectional and initial_state is not None:
            raise ValueError("ResettableRNN(bidirectional=True) does not take initial_state")
        outputs = self._rnn(steps, initial_state=initial_state, training=training)
        states = list(outputs[1:])
        # The cells' output is their first state; on padding it stays the last real output.
        sequences = outputs[0] if self.return_sequences else states[0]
        if self.bidirectional:
            backward = self._backward(inputs, valid, reset_steps, segment_ids, training)
            sequences = tf.concat([sequences, backward], axis=-1)
        return [sequences] + states if self.return_state else sequences

    def _backward(self, inputs, valid, resets, segment_ids, training):
        """``[B, T, H]``: the backward direction, restarted at each segment's last step."""
        if segment_ids is not None:
            following = tf.pad(segment_ids[:, 1:], [[0, 0], [0, 1]])
            ends = tf.logical_and(valid, tf.not_equal(segment_ids, following))
        else:
            next_reset = tf.pad(resets[:, 1:], [[0, 0], [0, 1]], constant_values=True)
            next_invalid = tf.pad(tf.logical_not(valid[:, 1:]), [[0, 0], [0, 1]],
                                  constant_values=True)
            ends = tf.logical_and(valid, tf.logical_or(next_reset, next_invalid))
        dtype = inputs.dtype
        steps = tf.concat([inputs, tf.cast(ends, dtype)[..., None],
                           tf.cast(valid, dtype)[..., None]], axis=-1)
        # Reversed in time, a segment's last step comes first: it starts from the zero state.
        outputs = self._backward_rnn(tf.reverse(steps, axis=[1]), training=training)
        return tf.reverse(outputs[0], axis=[1])

    def compute_mask(self, inputs, resets=None, mask=None, initial_state=None,
                     segment_ids=None):
        if mask is None and segment_ids is not None:
            mask = tf.not_equal(segment_ids, tf.zeros([], segment_ids.dtype))
        out_mask = mask if self.return_sequences else None
        if self.return_state:
            num_states = len(self.cell.state_size) if isinstance(
                self.cell.state_size, (list, tuple)) else 1
            return [out_mask] + [None] * num_states
        return out_mask

    def get_config(self):
        config = super().get_config()
        config.update({"cell": keras.saving.serialize_keras_object(self.cell),
                       "return_sequences": self.return_sequences,
                       "return_state": self.return_state,
                       "bidirectional": self.bidirectional})
        return config
