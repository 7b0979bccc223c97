"""tf.data service through separate server processes: exactly once, bad addresses, trust model.

The servers are ``scripts/data_service.py`` processes (a dispatcher and two workers on free
localhost ports), started once for the module and killed at its end.
"""

import collections
import logging as py_logging
import os
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import tfseq
from tfseq import distribute

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "data_service.py")
NUM_FILES, LINES_PER_FILE = 4, 150  # 600 examples, ids 0..599
ELEMENTS = 6000  # the epoch read through a killed worker or dispatcher

pytestmark = pytest.mark.slow


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start(args, log_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, SCRIPT, *args], stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def wait_for_log(path, text, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path) as f:
            content = f.read()
        if text in content:
            return content
        time.sleep(0.2)
    raise TimeoutError(f"{text!r} not in {path} after {timeout} s:\n{content}")


def stop(processes):
    for p in processes:
        if p.poll() is None:
            p.kill()
    for p in processes:
        p.wait(timeout=20)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """``(address, dispatcher log text)`` of a dispatcher + 2 worker processes on localhost."""
    logs = tmp_path_factory.mktemp("service")
    port = free_port()
    processes = []
    try:
        processes.append(start(["--role=dispatcher", f"--port={port}", "--trusted_network"],
                               logs / "dispatcher.log"))
        dispatcher_log = wait_for_log(logs / "dispatcher.log", "listening on")
        for i in range(2):
            processes.append(start(["--role=worker", f"--dispatcher_address=localhost:{port}",
                                    f"--port={free_port()}", "--trusted_network"],
                                   logs / f"worker{i}.log"))
        for i in range(2):
            wait_for_log(logs / f"worker{i}.log", "listening on")
        yield f"grpc://localhost:{port}", dispatcher_log
    finally:
        stop(processes)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """4 files of 150 lines; line k holds the example id k."""
    directory = tmp_path_factory.mktemp("corpus")
    paths = []
    for f in range(NUM_FILES):
        path = directory / f"part{f}.txt"
        path.write_text("".join(f"{f * LINES_PER_FILE + k}\n" for k in range(LINES_PER_FILE)))
        paths.append(str(path))
    return paths


def examples(files):
    """Example k: ``{"ids": int32 [k % 9 + 1] all k + 1, "ids_length"}``, read line by line."""
    def parse(line):
        k = tf.strings.to_number(line, tf.int32)
        ids = tf.fill([k % 9 + 1], k + 1)
        return {"ids": ids, "ids_length": tf.size(ids)}
    return tfseq.text_lines(files).map(parse)


def example_batches(files):
    """The same examples read ``text_lines(batch_size=32)``-style: ``{"ids": int32 [n, (T)]}``."""
    def parse(lines):
        k = tf.strings.to_number(lines, tf.int32)
        lengths = k % 9 + 1
        return {"ids": tf.RaggedTensor.from_row_lengths(tf.repeat(k + 1, lengths), lengths)}
    return tfseq.text_lines(files, batch_size=32).map(parse)


EXPECTED = collections.Counter({k + 1: k % 9 + 1 for k in range(NUM_FILES * LINES_PER_FILE)})


def token_counts(dataset):
    """Counts of the non-zero ids in every element (a dict, or a tuple of dicts)."""
    counts = collections.Counter()
    for element in dataset:
        for part in (element if isinstance(element, tuple) else (element,)):
            ids = part["ids"]
            ids = ids.flat_values if isinstance(ids, tf.RaggedTensor) else tf.reshape(ids, [-1])
            counts.update(int(v) for v in ids.numpy() if v)
    return counts


READERS = {"lines": examples, "line_batches": example_batches}
BATCHINGS = {
    "per_example": lambda ds: ds,
    "pad": lambda ds: ds.apply(tfseq.pad_batch(16)),
    "split": lambda ds: ds.apply(tfseq.pad_batch(16)).apply(tfseq.split_batch(2)),
    "bucket": lambda ds: ds.apply(tfseq.bucket_by_length(max_tokens=64, pool_size=64, seed=1)),
    "pack": lambda ds: ds.apply(tfseq.pack(16, max_tokens=64)),
}


@pytest.mark.parametrize("reader, batching", [
    ("lines", "per_example"), ("lines", "pad"), ("lines", "split"), ("lines", "bucket"),
    ("lines", "pack"), ("line_batches", "bucket"), ("line_batches", "pack")])
def test_separate_process_service_delivers_every_example_once(service, corpus, reader,
                                                              batching):
    address, _ = service
    local = token_counts(BATCHINGS[batching](READERS[reader](corpus)))
    assert local == EXPECTED
    remote = tfseq.use_data_service(BATCHINGS[batching](READERS[reader](corpus)), address,
                                    job_name=f"exactly_once_{reader}_{batching}")
    got = token_counts(remote)
    missing, extra = EXPECTED - got, got - EXPECTED
    assert (len(missing), len(extra)) == (0, 0), (
        f"{batching}: {sum(missing.values())} tokens lost, {sum(extra.values())} repeated")


def test_script_logs_its_unauthenticated_listening_addresses(service):
    address, dispatcher_log = service
    port = address.rsplit(":", 1)[1]
    assert f"listening on 0.0.0.0:{port} and [::]:{port} (all interfaces), UNAUTHENTICATED" \
        in dispatcher_log


def test_script_refuses_to_start_without_trusted_network(tmp_path):
    port = free_port()
    process = start(["--role=dispatcher", f"--port={port}"], tmp_path / "log")
    try:
        assert process.wait(timeout=60) == 2
    finally:
        stop([process])
    log = (tmp_path / "log").read_text()
    assert log.splitlines() == [
        "tfseq-data-service: error: refusing to start without --trusted_network: the tf.data "
        "service is unauthenticated and unencrypted and listens on every interface (anyone who "
        "reaches the port can run dataset graphs on the workers and read the data); run it "
        "behind a firewall, on a private subnet or through an SSH tunnel, then pass "
        "--trusted_network"]
    with socket.socket() as s:  # nothing listens on the port
        assert s.connect_ex(("localhost", port)) != 0


def test_bad_address_fails_fast_naming_it():
    address = f"grpc://localhost:{free_port()}"
    start_time = time.monotonic()
    with pytest.raises(ConnectionError, match=f"No tf.data service dispatcher reachable at "
                                              f"{address}"):
        tfseq.use_data_service(tf.data.Dataset.range(3), address)
    assert time.monotonic() - start_time < 60


def test_non_loopback_address_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(distribute, "_WARNED_NON_LOOPBACK", set())
    def probe(*args):  # stands in for the connection: the warning comes before it
        raise ConnectionError("probed")

    monkeypatch.setattr(distribute, "_probe", probe)
    with caplog.at_level(py_logging.WARNING):
        for address in ["grpc://10.1.2.3:5050"] * 2 + ["grpc://127.0.0.1:5050",
                                                       "grpc://localhost:5050"]:
            with pytest.raises(ConnectionError, match="probed"):
                tfseq.use_data_service(tf.data.Dataset.range(3), address)
    warnings = [r.getMessage() for r in caplog.records if "not a loopback" in r.getMessage()]
    assert warnings == ["tf.data service grpc://10.1.2.3:5050 is not a loopback address: the "
                        "service is unauthenticated and unencrypted, so anyone on that network "
                        "can read this training data and run dataset graphs on the workers. Use "
                        "it only on a trusted network (firewall, private subnet or SSH tunnel; "
                        "see docs/splitting.md)."]


def test_worker_killed_mid_epoch_loses_at_most_its_splits_and_repeats_nothing(tmp_path):
    """distributed_epoch (DYNAMIC sharding) under a SIGKILLed and restarted worker: every
    element at most once (the dead worker's in-flight elements are lost), the epoch ends."""
    port, worker_ports = free_port(), [free_port(), free_port()]
    processes = []

    def worker(i):
        log = tmp_path / f"worker{i}_{len(processes)}.log"
        process = start(["--role=worker", f"--dispatcher_address=localhost:{port}",
                         f"--port={worker_ports[i]}", "--trusted_network"], log)
        processes.append(process)
        wait_for_log(log, "listening on")
        return process

    try:
        processes.append(start(["--role=dispatcher", f"--port={port}", "--trusted_network",
                                f"--work_dir={tmp_path / 'journal'}"], tmp_path / "dispatcher.log"))
        wait_for_log(tmp_path / "dispatcher.log", "listening on")
        worker(0)
        worker(1)
        iterator = iter(tfseq.use_data_service(tf.data.Dataset.range(ELEMENTS),
                                               f"grpc://localhost:{port}"))
        got = [int(next(iterator)) for _ in range(ELEMENTS // 10)]  # mid-epoch
        processes[2].kill()
        processes[2].wait(timeout=20)
        worker(1)
        start_time = time.monotonic()
        for value in iterator:
            got.append(int(value))
            assert time.monotonic() - start_time < 90, "epoch did not end"
    finally:
        stop(processes)
    assert len(got) == len(set(got))  # nothing repeated
    lost = ELEMENTS - len(got)
    assert 0 <= lost < ELEMENTS
    print(f"lost {lost} of {ELEMENTS}")


def test_dispatcher_restarted_with_its_work_dir_keeps_the_epoch(tmp_path):
    """A SIGKILLed dispatcher (one worker) restarted with the same --work_dir and port: the
    reader goes on, nothing repeats and the epoch ends."""
    port = free_port()
    processes = []

    def server(name, args):
        log = tmp_path / f"{name}_{len(processes)}.log"
        processes.append(start([*args, "--trusted_network"], log))
        wait_for_log(log, "listening on")
        return processes[-1]

    dispatcher_args = ["--role=dispatcher", f"--port={port}", f"--work_dir={tmp_path / 'j'}"]
    try:
        dispatcher = server("dispatcher", dispatcher_args)
        server("worker", ["--role=worker", f"--dispatcher_address=localhost:{port}",
                          f"--port={free_port()}"])
        iterator = iter(tfseq.use_data_service(tf.data.Dataset.range(ELEMENTS),
                                               f"grpc://localhost:{port}"))
        got = [int(next(iterator)) for _ in range(ELEMENTS // 10)]  # mid-epoch
        dispatcher.kill()
        dispatcher.wait(timeout=20)
        server("dispatcher", dispatcher_args)
        start_time = time.monotonic()
        for value in iterator:
            got.append(int(value))
            assert time.monotonic() - start_time < 90, "epoch did not end"
    finally:
        stop(processes)
    assert len(got) == len(set(got))  # nothing repeated
    print(f"dispatcher restart: lost {ELEMENTS - len(got)} of {ELEMENTS}")


def test_train_binary_on_the_service_writes_the_report_of_every_mode(service, tmp_path):
    """``tfseq-train --num_replicas=2 --data_service=...``: model.fit on the service's split
    batches; the same report schema as the other modes, real tokens/s measured."""
    import json

    address, _ = service
    books = ["Gen", "Ps", "Isa", "Matt", "Rom", "Rev", "Josh"]
    (tmp_path / "tiny.tsv").write_text("".join(
        f"{books[i % 7]}\t{i // 30 + 1}\t{i % 30 + 1}\t"
        + " ".join(f"{books[i % 7].lower()}{j % 5}" for j in range(i % 9 + 2)) + "\n"
        for i in range(140)))
    run = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"),
         f"--files={tmp_path / 'tiny.tsv'}", "--num_replicas=2", f"--data_service={address}",
         "--epochs=1", "--max_tokens=64", "--max_length=16", f"--model_dir={run}",
         "--verbose=0", "--export=false"],
        capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert (report["mode"], report["replicas"], report["data_service"]) == (
        "data_service", 2, address)
    assert isinstance(report["history"], list) and report["history"][0]["epoch"] == 1
    assert report["real_tokens_per_second"] > 0 and 0 < report["padding_efficiency"] <= 1
    assert 0.0 <= report["eval"]["accuracy"] <= 1.0
