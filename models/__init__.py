"""Keras models of the tasks; installed as ``tfseq.models``."""
