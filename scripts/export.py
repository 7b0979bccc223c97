r"""Export a trained run as a SavedModel that takes raw text (``tfseq.serving``).

Usage:
  tfseq-export --model_dir=runs/demo                 # writes runs/demo/export
  tfseq-export --model_dir=runs/demo --export_dir=/srv/models/demo/1

``tfseq-train`` exports at the end of every finished run, so this is for exporting again
elsewhere, or an interrupted run's newest checkpoint. It reads the run's ``run.json`` (task and
config), its saved vocabularies and labels, and restores the newest weights (the ``ckpt/``
checkpoint, or ``weights.weights.h5`` of a ``--data_service`` run). A ``--batching=pack`` run is
served like the others: each input line is one padded row (one segment).

The export holds a graph that runs when loaded: export and serve only model directories you
trust.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from tfseq.scripts import flag_table  # noqa: E402

FLAGS = flags.FLAGS
flag_table.define(["model_dir"], defaults={"model_dir": None}, required=["model_dir"],
                  helps={"model_dir": "A tfseq-train model directory."})
flags.DEFINE_string("export_dir", None, "Where to write the SavedModel "
                    "(default: <model_dir>/export).")


def main(argv):
    import tensorflow as tf

    from tfseq.pipelines import exporting

    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # the SavedModel writer's INFO lines
    tf.get_logger().setLevel("ERROR")
    try:
        task, config, saved = exporting.load_run(FLAGS.model_dir)
        model, state = exporting.restore_model(FLAGS.model_dir, task, config, saved)
    except (FileNotFoundError, ValueError) as e:
        raise app.UsageError(str(e))
    path = exporting.export_run(FLAGS.model_dir, task, config, state, model, FLAGS.export_dir)
    print(f"Served model ({task.name}, input `{task.prediction_input}`): {path}")


def run():
    """The ``tfseq-export`` command."""
    from tfseq.scripts import run_command
    run_command(__name__, main)


if __name__ == "__main__":
    run()
