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
      **kwargs: forwarded to ``keras.layers.Layer``.

    Call arguments:
      inputs: float ``[B, T, D]``.
      resets: bool ``[B, T]``, true where a segment starts (``"<name>_resets"`` of a packed
        batch); the state is set to zero before that step. ``None``: never reset.
      mask: bool ``[B, T]``, false on padding (e.g. ``segment_ids > 0``, or propagated from an
        ``Embedding(mask_zero=True)``); padding keeps the state and outputs zeros.
      initial_state: the state(s) to start from, e.g. the last state of the previous batch
        (a list, ``[h]`` for GRU, ``[h, c]`` for LSTM). Default zeros.
      training: forwarded to the cell (dropout).

    Returns:
      ``[B, T, H]`` (or ``[B, H]``), followed by the final states when ``return_state``.

    Example:
      >>> rnn = ResettableRNN(keras.layers.GRUCell(32))
      >>> y = rnn(embedded, batch["ids_resets"], mask=batch["ids_segment_ids"] > 0)
    """

    def __init__(self, cell, return_sequences: bool = True, return_state: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
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

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        self._built_input_shape = input_shape
        self._rnn.build(input_shape[:-1] + (input_shape[-1] + 2,))
        self.built = True

    def get_build_config(self):
        shape = getattr(self, "_built_input_shape", None)
        return None if shape is None else {"input_shape": shape}

    def build_from_config(self, config):
        if config and "input_shape" in config:
            self.build(config["input_shape"])

    def call(self, inputs, resets=None, mask=None, initial_state=None, training=None):
        shape = tf.shape(inputs)[:2]
        dtype = inputs.dtype
        resets = tf.zeros(shape, dtype) if resets is None else tf.cast(resets, dtype)
        valid = tf.ones(shape, dtype) if mask is None else tf.cast(mask, dtype)
        steps = tf.concat([inputs, resets[..., None], valid[..., None]], axis=-1)
        for reset in ("reset_dropout_mask", "reset_recurrent_dropout_mask"):
            if hasattr(self.cell, reset):
                getattr(self.cell, reset)()
        if initial_state is not None and not isinstance(initial_state, (list, tuple)):
            initial_state = [initial_state]
        outputs = self._rnn(steps, initial_state=initial_state, training=training)
        states = list(outputs[1:])
        # The cells' output is their first state; on padding it stays the last real output.
        sequences = outputs[0] if self.return_sequences else states[0]
        return [sequences] + states if self.return_state else sequences

    def compute_mask(self, inputs, resets=None, mask=None, initial_state=None):
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
                       "return_state": self.return_state})
        return config
