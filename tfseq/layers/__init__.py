"""Keras 3 layers for ragged, padded and packed sequence batches."""

# --- masked softmax and attention
from tfseq.layers.attention_pooling import AttentionPooling
from tfseq.layers.masked_attention import MaskedAttention
from tfseq.layers.masked_softmax import masked_softmax

# --- recurrent layers
from tfseq.layers.ragged_rnn import RaggedRNN
