"""Keras 3 layers for ragged, padded and packed sequence batches."""

# --- masked softmax and attention
from tfseq.layers.attention_pooling import AttentionPooling
from tfseq.layers.masked_attention import MaskedAttention
from tfseq.layers.masked_softmax import masked_softmax
from tfseq.layers.segments import SegmentPooling, segment_attention_mask, segment_mean

# --- recurrent layers
from tfseq.layers.ragged_rnn import RaggedRNN
from tfseq.layers.resettable_rnn import ResettableRNN
