"""Starts a tf.data service dispatcher or worker and blocks until killed.

A tf.data service moves input preprocessing off the training machine: one dispatcher hands
out work, any number of workers run the input pipeline, and the trainer reads the results
(``tfseq.use_data_service``, ``train.py --data_service=grpc://host:port``).

Usage:
  # a dispatcher on port 5050 (fault tolerant when --work_dir is given)
  python scripts/data_service.py --role=dispatcher --port=5050 --work_dir=/tmp/tfdata
  # two workers on the same host
  python scripts/data_service.py --role=worker --dispatcher_address=localhost:5050 --port=5051
  python scripts/data_service.py --role=worker --dispatcher_address=localhost:5050 --port=5052

Workers import tfseq (and tensorflow_text), so pipelines that use its ops run on them.
"""

from __future__ import annotations

import os

from absl import app, flags, logging

flags.DEFINE_enum("role", "dispatcher", ["dispatcher", "worker"], "Which server to start.")
flags.DEFINE_integer("port", 0, "Port to listen on; 0 picks a free port (logged).")
flags.DEFINE_string("dispatcher_address", "localhost:5050",
                    "Workers: the dispatcher's host:port (no grpc:// prefix).")
flags.DEFINE_string("worker_address", None,
                    "Workers: the host:port the dispatcher should give clients to reach this "
                    "worker; default localhost:<port>. '%port%' is replaced by the port.")
flags.DEFINE_string("work_dir", None,
                    "Dispatcher: directory for its journal; makes it fault tolerant (a restart "
                    "recovers its state).")
flags.DEFINE_string("protocol", "grpc", "Transport protocol.")

FLAGS = flags.FLAGS


def start_server(role: str, port: int = 0, dispatcher_address: str | None = None,
                 worker_address: str | None = None, work_dir: str | None = None,
                 protocol: str = "grpc"):
    """Starts a dispatcher or worker server (already serving) and returns it."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers its ops for pipelines run on workers)

    import tfseq  # noqa: F401  (tfseq's ops, if any, must be loaded in the worker process)

    service = tf.data.experimental.service
    if role == "dispatcher":
        if work_dir:
            os.makedirs(work_dir, exist_ok=True)
        config = service.DispatcherConfig(port=port, protocol=protocol, work_dir=work_dir,
                                          fault_tolerant_mode=bool(work_dir))
        return service.DispatchServer(config)
    if not dispatcher_address:
        raise ValueError("--role=worker needs --dispatcher_address=host:port")
    config = service.WorkerConfig(dispatcher_address=dispatcher_address,
                                  worker_address=worker_address or "localhost:%port%",
                                  port=port, protocol=protocol)
    return service.WorkerServer(config)


def main(argv):
    del argv
    server = start_server(FLAGS.role, FLAGS.port, FLAGS.dispatcher_address,
                          FLAGS.worker_address, FLAGS.work_dir, FLAGS.protocol)
    if FLAGS.role == "dispatcher":
        logging.info("tf.data service dispatcher serving at %s", server.target)
    else:
        logging.info("tf.data service worker on %s, dispatcher %s",
                     server._address, FLAGS.dispatcher_address)  # pylint: disable=protected-access
    server.join()


if __name__ == "__main__":
    app.run(main)
