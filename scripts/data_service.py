r"""Starts a tf.data service dispatcher or worker and blocks until killed.

A tf.data service moves input preprocessing off the training machine: one dispatcher hands
out work, any number of workers run the input pipeline, and the trainer reads the results
(``tfseq.use_data_service``, ``train.py --data_service=grpc://host:port``).

TRUST MODEL -- read before starting a server. The tf.data service has no authentication and
no encryption, and TensorFlow 2.21 cannot bind it to one interface: the port listens on EVERY
interface of the machine (``*:PORT``). Anyone who can reach the port can register a dataset
graph, which runs on the workers with their user's rights (it can read any file that user can
read, e.g. ``TextLineDataset("/home/me/.ssh/id_rsa")``) and fetch the results, and can read
the training data in flight. Run it only on a trusted network: a private subnet, or a
firewall that admits only the training machines (e.g. ``ufw allow from 10.0.0.0/24 to any
port 5050``; ``iptables -A INPUT -p tcp --dport 5050 ! -s 127.0.0.1 -j DROP`` for one
machine), or an SSH tunnel (``ssh -N -L 5050:localhost:5050 data-host``). This script
therefore refuses to start until you pass ``--trusted_network`` to say the port is
firewalled or on a trusted network; it logs the addresses it listens on.

Usage:
  # a dispatcher on port 5050 (fault tolerant when --work_dir is given)
  tfseq-data-service --role=dispatcher --port=5050 --work_dir=/tmp/tfdata \
      --trusted_network
  # two workers on the same host
  tfseq-data-service --role=worker --dispatcher_address=localhost:5050 --port=5051 \
      --trusted_network
  tfseq-data-service --role=worker --dispatcher_address=localhost:5050 --port=5052 \
      --trusted_network

Workers import tfseq (and tensorflow_text), so pipelines that use its ops run on them.
"""

from __future__ import annotations

import os
import sys


from absl import flags, logging  # noqa: E402

TRUST_MODEL = (
    "The tf.data service is UNAUTHENTICATED and UNENCRYPTED and listens on every interface "
    "(TensorFlow has no bind-address option): anyone who can reach the port can run a dataset "
    "graph on the workers (reading any file their user can read) and read the data in flight. "
    "Use it only behind a firewall, on a private subnet, or through an SSH tunnel, and pass "
    "--trusted_network to acknowledge this.")

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
flags.DEFINE_boolean("trusted_network", False,
                     "Required: acknowledges that the port is open on every interface with no "
                     "authentication. " + TRUST_MODEL)

FLAGS = flags.FLAGS


def start_server(role: str, port: int = 0, dispatcher_address: str | None = None,
                 worker_address: str | None = None, work_dir: str | None = None,
                 protocol: str = "grpc"):
    """Starts a dispatcher or worker server (already serving) and returns it.

    The server listens on every interface with no authentication (see the module docstring).
    """
    import tfseq  # noqa: F401  (TensorFlow, quietly; tfseq's ops in the worker process)

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers its ops for pipelines run on workers)

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
    from absl import app

    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not FLAGS.trusted_network:
        raise app.UsageError(
            "refusing to start without --trusted_network: the tf.data service is "
            "unauthenticated and unencrypted and listens on every interface (anyone who reaches "
            "the port can run dataset graphs on the workers and read the data); run it behind "
            "a firewall, on a private subnet or through an SSH tunnel, then pass "
            "--trusted_network")
    server = start_server(FLAGS.role, FLAGS.port, FLAGS.dispatcher_address,
                          FLAGS.worker_address, FLAGS.work_dir, FLAGS.protocol)
    if FLAGS.role == "dispatcher":
        port = int(server.target.rsplit(":", 1)[1])
        logging.warning("tf.data service dispatcher listening on 0.0.0.0:%d and [::]:%d (all "
                        "interfaces), UNAUTHENTICATED; clients use %s", port, port, server.target)
    else:
        port = int(server._address.rsplit(":", 1)[1])  # pylint: disable=protected-access
        logging.warning("tf.data service worker listening on 0.0.0.0:%d and [::]:%d (all "
                        "interfaces), UNAUTHENTICATED; advertised as %s; dispatcher %s", port,
                        port, server._address, FLAGS.dispatcher_address)  # pylint: disable=protected-access
    sys.stderr.flush()
    server.join()


def run():
    """The ``tfseq-data-service`` command."""
    from tfseq.scripts import run_command
    run_command(__name__, main)


if __name__ == "__main__":
    run()
