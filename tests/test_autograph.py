"""AutoGraph and tfseq: tfseq's own functions are traced as written (converting their source
cost seconds of every pipeline's construction); a function a caller hands to tfseq, or a
method of a caller's subclass, is converted as the caller's own code would be."""

import pytest
import tensorflow as tf
from tensorflow.python.autograph.impl import api

import tfseq
from tfseq.replay import ReplayStream


@pytest.fixture
def converted():
    """The qualified names of the functions AutoGraph converts while the test runs."""
    names = []
    convert = api._convert_actual

    def spy(entity, program_ctx):
        names.append(f"{getattr(entity, '__module__', '?')}.{entity.__qualname__}")
        return convert(entity, program_ctx)

    api._convert_actual = spy
    try:
        yield names
    finally:
        api._convert_actual = convert


def test_a_pipeline_of_tfseq_functions_converts_none_of_them(tmp_path, converted):
    path = tmp_path / "lines.txt"
    path.write_text("a b c\nd e\nf\n")
    vocab = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "a", "b", "c", "d", "e", "f"])
    ds = (tfseq.text_lines([str(path)], batch_size=2)
          .apply(tfseq.tokenize(vocab))
          .apply(tfseq.filter_by_length(max_length=2, counter=tfseq.DropCounter()))
          .apply(tfseq.pad_batch(batch_size=4)))
    assert [batch["ids_length"].numpy().tolist() for batch in ds] == [[2, 1]]

    def mine(x):  # the caller's own function: converted as usual
        return x + 1

    assert list(tf.data.Dataset.range(2).map(mine).as_numpy_iterator()) == [1, 2]
    assert [name for name in converted if name.startswith("tfseq")] == []
    assert converted == [f"{__name__}.test_a_pipeline_of_tfseq_functions_converts_none_of_them"
                         ".<locals>.mine"]


def halve_large(batch):
    """Python control flow on a tensor: needs AutoGraph in a graph."""
    if tf.reduce_sum(batch) > 4:
        batch = batch // 2
    return batch


def test_a_callers_function_called_from_tfseq_is_still_converted():
    stream = ReplayStream(lambda epoch: tf.data.Dataset.range(5).batch(2), map_fn=halve_large)
    ds = stream.dataset(tf.Variable(0, dtype=tf.int64), tf.Variable(0, dtype=tf.int64))
    assert [batch.numpy().tolist() for batch in ds] == [[0, 1], [1, 1], [4]]


def test_a_served_subclass_of_a_callers_own_is_converted_in_serve(tmp_path):
    from tfseq import serving

    class Doubled(serving.Served):
        """A caller's own task: its ``_predict`` branches on a tensor (AutoGraph's job)."""

        def _predict(self, ids, lengths):
            if tf.reduce_max(lengths) > 2:
                lengths = lengths * 2
            return {"n": lengths}

    vocab = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "a", "b"])
    served = Doubled(serving.TextEncoder(vocab, str(tmp_path), max_length=8), "truncate")
    assert served.serve(tf.constant(["a b", "a"]))["n"].numpy().tolist() == [2, 1]
    assert served.serve(tf.constant(["a b a", "b"]))["n"].numpy().tolist() == [6, 2]
