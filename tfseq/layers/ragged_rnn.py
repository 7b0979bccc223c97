"""RaggedRNN: run any Keras 3 RNN (or Bidirectional RNN) on ragged or padded batches, exactly.

Shapes: B = batch, T = time (padded), D = features, H = units.

Keras 3 ``LSTM``/``GRU`` reject ``tf.RaggedTensor`` ("Cannot index into an inner ragged
dimension"). This wrapper pads the batch, builds the valid mask, and runs the wrapped layer with
that mask, so the state is carried unchanged over pads and the returned state is the state after
each sequence's last real step. A backward direction (``Bidirectional`` or ``go_backwards=True``)
does not reverse the padded tensor (which would start every row on its pads): it reverses only
each row's real steps with ``tf.reverse_sequence``, so it starts at the row's last real step:

    row (length 3, T=5)     x1 x2 x3 0 0
    forward reads           x1 x2 x3 . .   -> state after x3
    backward reads          x3 x2 x1 . .   -> state after x1; outputs re-aligned to x1 x2 x3

Outputs on pad steps are exactly 0; sequence outputs come back ragged for a ragged input
(``output_format="auto"``) or as asked.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tfseq.layers import _masks

OUTPUT_FORMATS = ("auto", "ragged", "padded")
MERGE_MODES = ("concat", "sum", "mul", "ave", None)


def _copy_rnn(rnn, name):
    """A fresh copy of ``rnn`` that returns sequences and states and reads forwards."""
    if getattr(rnn, "stateful", False):
        raise ValueError(f"RaggedRNN does not support stateful RNNs; received {rnn.name!r} "
                         "with stateful=True")
    config = rnn.get_config()
    config.update(return_sequences=True, return_state=True, go_backwards=False, name=name)
    return rnn.__class__.from_config(config)


def _num_states(rnn) -> int:
    return len(tf.nest.flatten(rnn.cell.state_size))


@keras.saving.register_keras_serializable(package="tfseq")
class RaggedRNN(keras.layers.Layer):
    """Wraps a Keras RNN layer so it runs on ragged or padded batches with exact masking.

    Args:
      layer: a ``keras.layers.RNN`` instance (``GRU``, ``LSTM``, ``SimpleRNN``, ``RNN(cell)``)
        or a ``keras.layers.Bidirectional`` wrapping one. Its ``return_sequences``,
        ``return_state``, ``go_backwards`` and (Bidirectional) ``merge_mode`` define what this
        layer returns, as in Keras. The wrapper builds and owns its own copy (like
        ``Bidirectional`` does), so pass an unbuilt layer.
      output_format: ``"auto"`` (sequences ragged for a ragged input, padded for a padded
        one), ``"ragged"`` or ``"padded"``.
      **kwargs: forwarded to ``keras.layers.Layer``.

    Call arguments:
      inputs: float RaggedTensor ``[B, (T), D]`` or padded ``[B, T, D]``.
      lengths: optional int ``[B]`` for a padded input (steps ``< lengths[b]`` are real).
      mask: optional bool ``[B, T]`` (a Keras mask; filled in from masked inputs). A mask
        with holes is honoured: the state skips masked steps.
      initial_state: optional list of ``[B, H]`` states (forward states then backward states
        for a Bidirectional layer).
      training: forwarded to the wrapped layer (dropout).

    Returns:
      As the wrapped layer: the sequences (``[B, (T), H']`` ragged or ``[B, T, H']`` padded with
      zeros) if ``return_sequences`` else the output at each row's last real step ``[B, H']``
      (zeros for an empty row); with ``return_state`` a list ``[output, *states]`` where the
      states are those after the last real step (the first real step for a backward
      direction). ``H' = 2H`` for ``merge_mode="concat"``; ``merge_mode=None`` gives a pair.

    Raises:
      TypeError: ``layer`` is not an RNN or a Bidirectional RNN.
      ValueError: unknown ``output_format``, or a stateful RNN.

    Example:
      >>> rnn = RaggedRNN(keras.layers.GRU(4, return_state=True))
      >>> last, state = rnn(tf.ragged.constant([[[1.0], [2.0]], [[3.0]]], ragged_rank=1))
      >>> last.shape, state.shape
      (TensorShape([2, 4]), TensorShape([2, 4]))
    """

    def __init__(self, layer, output_format: str = "auto", **kwargs):
        super().__init__(**kwargs)
        if isinstance(layer, dict):
            layer = keras.saving.deserialize_keras_object(layer)
        if output_format not in OUTPUT_FORMATS:
            raise ValueError(f"output_format must be one of {OUTPUT_FORMATS}; received "
                             f"output_format={output_format!r}")
        if isinstance(layer, keras.layers.Bidirectional):
            forward, backward = layer.forward_layer, layer.backward_layer
            self.merge_mode = layer.merge_mode
            self.go_backwards = False
        elif isinstance(layer, keras.layers.RNN):
            forward, backward = layer, None
            self.merge_mode = None
            self.go_backwards = bool(layer.go_backwards)
        else:
            raise TypeError("layer must be a keras.layers.RNN (GRU, LSTM, SimpleRNN, RNN) or a "
                            f"keras.layers.Bidirectional RNN; received {type(layer).__name__}")
        self.layer_config = keras.saving.serialize_keras_object(layer)
        self.output_format = output_format
        self.return_sequences = bool(forward.return_sequences)
        self.return_state = bool(forward.return_state)
        self.bidirectional = backward is not None
        self.forward_layer = _copy_rnn(forward, f"forward_{forward.name}")
        self.backward_layer = (_copy_rnn(backward, f"backward_{backward.name}")
                               if backward is not None else None)
        self.supports_masking = True

    def build(self, inputs_shape):
        shape = (None, None, inputs_shape[-1])
        self.forward_layer.build(shape)
        if self.backward_layer is not None:
            self.backward_layer.build(shape)

    def call(self, inputs, lengths=None, mask=None, initial_state=None, training=None):
        ragged_input = isinstance(inputs, tf.RaggedTensor)
        if mask is None and (lengths is not None or initial_state is not None):
            mask = _masks.keras_mask(inputs)  # Keras fills `mask` only when inputs is alone.
        padded, ragged_lengths = _masks.densify(inputs)
        valid = _masks.all_of(_masks.valid_mask(padded, lengths=lengths, mask=mask),
                              _masks.valid_mask(padded, lengths=ragged_lengths))
        time = tf.shape(padded)[1]
        if valid is None:
            valid = tf.ones(tf.shape(padded)[:2], tf.bool)
        # Keras RNNs cannot run zero steps: give an all-empty batch one masked step.
        extra = tf.maximum(1 - time, 0)
        padded = tf.pad(padded, [[0, 0], [0, extra], [0, 0]])
        valid = tf.pad(valid, [[0, 0], [0, extra]])
        ends = _masks.lengths_of(valid, time + extra)

        forward_state, backward_state = self._split_state(initial_state)
        sequences, last, states = self._run(
            self.forward_layer, padded, valid, ends, forward_state, training,
            reverse=self.go_backwards)
        if self.backward_layer is not None:
            back_sequences, back_last, back_states = self._run(
                self.backward_layer, padded, valid, ends, backward_state, training, reverse=True)
            back_sequences = tf.reverse_sequence(back_sequences, ends, seq_axis=1, batch_axis=0)
            sequences = self._merge(sequences, back_sequences)
            last = self._merge(last, back_last)
            states = states + back_states

        if self.return_sequences:
            sequences = tf.nest.map_structure(lambda s: s[:, :time], sequences)
            if self.output_format == "ragged" or (self.output_format == "auto" and ragged_input):
                row_lengths = tf.minimum(ends, time)
                sequences = tf.nest.map_structure(
                    lambda s: tf.RaggedTensor.from_tensor(s, lengths=row_lengths), sequences)
            output = sequences
        else:
            output = last
        if self.return_state:
            return [output] + states
        return output

    @staticmethod
    def _run(layer, padded, valid, ends, initial_state, training, reverse):
        """Runs one direction; returns (sequences [B, T, H] in reading order with 0 on pads,
        last output [B, H], states)."""
        if reverse:
            padded = tf.reverse_sequence(padded, ends, seq_axis=1, batch_axis=0)
            valid = tf.reverse_sequence(valid, ends, seq_axis=1, batch_axis=0)
        outputs = layer(padded, mask=valid, initial_state=initial_state, training=training)
        sequences, states = outputs[0], list(outputs[1:])
        sequences = tf.where(valid[..., tf.newaxis], sequences, tf.zeros([], sequences.dtype))
        last = tf.gather(sequences, tf.maximum(ends - 1, 0), axis=1, batch_dims=1)
        last = tf.where((ends > 0)[:, tf.newaxis], last, tf.zeros([], last.dtype))
        return sequences, last, states

    def _merge(self, forward, backward):
        if self.merge_mode == "concat":
            return tf.concat([forward, backward], axis=-1)
        if self.merge_mode == "sum":
            return forward + backward
        if self.merge_mode == "mul":
            return forward * backward
        if self.merge_mode == "ave":
            return (forward + backward) / tf.constant(2, forward.dtype)
        return [forward, backward]

    def _split_state(self, initial_state):
        if initial_state is None:
            return None, None
        initial_state = list(initial_state) if isinstance(initial_state, (list, tuple)) \
            else [initial_state]
        if self.backward_layer is None:
            return initial_state, None
        count = _num_states(self.forward_layer)
        if len(initial_state) != 2 * count:
            raise ValueError(f"A Bidirectional RaggedRNN needs {2 * count} initial states "
                             f"(forward then backward); received {len(initial_state)}")
        return initial_state[:count], initial_state[count:]

    def compute_mask(self, inputs, previous_mask=None):
        sequence_mask = None
        if (self.return_sequences and self.output_format != "ragged"
                and not isinstance(inputs, tf.RaggedTensor)):
            sequence_mask = previous_mask
        output_mask = ([sequence_mask, sequence_mask]
                       if self.bidirectional and self.merge_mode is None else sequence_mask)
        if not self.return_state:
            return output_mask
        count = _num_states(self.forward_layer) * (2 if self.bidirectional else 1)
        return [output_mask] + [None] * count

    def get_config(self):
        config = super().get_config()
        config.update(layer=self.layer_config, output_format=self.output_format)
        return config
