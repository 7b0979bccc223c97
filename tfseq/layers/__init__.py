"""Keras 3 layers for ragged, padded and packed sequence batches."""

# --- masked softmax and attention
from tfseq.layers.segments import segment_attention_mask, segment_mean
from tfseq.layers.masked_softmax import masked_softmax

# --- recurrent layers
from tfseq.layers.resettable_rnn import ResettableRNN
