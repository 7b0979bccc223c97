"""Keras 3 layers for ragged, padded and packed sequence batches."""

# --- masked softmax and attention

# --- recurrent layers
