"""Feeding several replicas: per-replica datasets, global loss scaling, the tf.data service.

Shapes: B = rows in a global batch, b = rows in one replica's part, T = time.

The problem this module solves: ``experimental_distribute_dataset`` re-batches each global
batch across replicas and hands some replicas an *empty* batch at the end of an epoch (or of
every bucket), which hangs or NaNs multi-replica training; and a loss averaged over each
replica's local batch is wrong as soon as local batches differ in size (bucketing, packing).

``replica_dataset_fn`` builds the ``dataset_fn`` for
``strategy.distribute_datasets_from_function``. Per input pipeline (one per worker) it reads
its share of the data, batches for all of its replicas at once (a per-replica budget times
the number of local replicas), splits every batch in-graph with ``tfseq.split_batch`` and
emits the parts one after another. ``tf.distribute`` hands a worker's elements to its
replicas round robin, so replica ``i`` always receives part ``i`` and every step is complete:
every replica takes the same number of steps, none ever sees an empty batch::

    global batch (per worker)        B = 10 rows, 4 local replicas
    split_batch(4)                   parts of 3, 3, 2, 2 rows (dummy rows of weight 0
                                     when B < 4)
    emitted elements                 part 0, part 1, part 2, part 3, part 0 of the next ...
    replica                          0       1       2       3       0 ...

``GlobalWeightedLoss`` (or ``global_weighted_mean`` in a custom loop) divides each replica's
weighted loss sum by the weight summed over ALL replicas (an all-reduce), so after the usual
gradient all-reduce the update equals the single-device update on the whole global batch:
dummy rows (weight 0) and uneven parts change nothing.

``use_data_service`` moves the whole pipeline onto a tf.data service (``scripts/data_service.py``
starts one) so that preprocessing scales beyond the training machine.

Use with ``model.fit`` under ``MirroredStrategy``::

    strategy = tf.distribute.MirroredStrategy()
    dataset_fn = tfseq.replica_dataset_fn(
        lambda num_shards, shard_index: read_and_tokenize(num_shards, shard_index),
        lambda n: tfseq.bucket_by_length(max_tokens=4096 * n, batch_multiple=n),
        balance="tokens",
        map_fn=lambda part: ({"ids": part["ids"], "ids_length": part["ids_length"]},
                             part["label"], part["weight"]))
    with strategy.scope():
        model = make_model()
        model.compile(optimizer="adam", loss=tfseq.GlobalWeightedLoss(
            keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
    model.fit(strategy.distribute_datasets_from_function(dataset_fn), epochs=3)

The sample weight (the part's ``"weight"``) is what removes dummy rows from the loss; for
per-token losses pass ``weight[:, None] * mask`` so the denominator is the global number of
real tokens.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any, Callable, Mapping

import keras
import tensorflow as tf
from absl import logging

from tfseq._common import Transform, check_positive_int
from tfseq.splitting import split_batch

SHARD_BY = ("files", "batches")
PROCESSING_MODES = ("distributed_epoch", "parallel_epochs")
MakeDataset = Callable[[int, int], tf.data.Dataset]
BatchFn = Callable[[int], Transform]


def _one_after_another(parts: tuple) -> tf.data.Dataset:
    """A dataset of the elements of the tuple ``parts``, in order."""
    dataset = tf.data.Dataset.from_tensors(parts[0])
    for part in parts[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(part))
    return dataset


def _local_replicas(input_context: tf.distribute.InputContext) -> int:
    replicas, pipelines = input_context.num_replicas_in_sync, input_context.num_input_pipelines
    if replicas % pipelines:
        raise ValueError(f"num_replicas_in_sync={replicas} is not a multiple of "
                         f"num_input_pipelines={pipelines}; replica_dataset_fn needs the "
                         "same number of replicas on every worker.")
    return replicas // pipelines


def replica_dataset_fn(make_dataset: MakeDataset, batch_fn: BatchFn, *,
                       balance: str = "examples", shard_by: str = "files", trim: bool = False,
                       equal_rows: bool = True,
                       map_fn: Callable[[Mapping[str, Any]], Any] | None = None,
                       data_service: str | None = None, job_name: str | None = None,
                       ) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """Builds the ``dataset_fn`` for ``strategy.distribute_datasets_from_function``.

    Args:
      make_dataset: ``make_dataset(num_shards, shard_index)`` returns the dataset of unbatched
        examples (dicts, see the element contract) of one shard, e.g.
        ``lambda n, i: tfseq.text_lines(files, num_shards=n, shard_index=i).apply(...)``.
      batch_fn: ``batch_fn(num_replicas)`` returns the batching transformation for a batch
        that ``num_replicas`` replicas will share: give it the per-replica budget times
        ``num_replicas`` (and ``batch_multiple=num_replicas`` with ``bucket_by_length``, so
        that with ``balance="examples"`` no part exceeds the per-replica budget).
      balance: how ``split_batch`` balances the parts: ``"examples"`` or ``"tokens"``.
      shard_by: ``"files"``: each input pipeline (worker) reads shard
        ``input_pipeline_id`` of ``num_input_pipelines`` and splits its batches over its own
        replicas. Every replica of one worker steps equally; with several workers, shards can
        yield different numbers of batches, so use ``.repeat()`` and ``steps_per_epoch``.
        ``"batches"``: every worker reads everything, builds the same global batches, splits
        each over ALL replicas and keeps its own replicas' parts: equal steps everywhere at
        the cost of redundant reading (needs a deterministic ``make_dataset``: same seed).
      trim: passed to ``split_batch``: cut each part to its own longest row. Keep false
        for ``model.fit`` (see ``equal_rows``).
      equal_rows: passed to ``split_batch``: fill every part with dummy rows to the same
        row count, so that (with ``trim=False`` and dense features) all replicas get the same
        shapes. Keras ``model.fit`` under a strategy needs that: it reduces the first batch
        across replicas to build the model, which fails on parts of different shapes.
        Custom training loops may set it false (and use ragged features or ``trim``).
      map_fn: optional function applied to each part (a dict), e.g. to make the
        ``(x, y, sample_weight)`` tuples that ``model.fit`` expects.
      data_service: a tf.data service address ``"grpc://host:port"``: the dataset up to the
        split runs on the service (``distributed_epoch``, the service shards the source, so
        ``make_dataset(1, 0)`` is called); the parts are emitted on the trainer, so they stay
        aligned with the replicas. Needs ``shard_by="files"``.
      job_name: tf.data service job name shared by several consumers (``None``: a job of
        this consumer alone).

    Returns:
      ``dataset_fn(input_context) -> tf.data.Dataset`` emitting, per worker, the parts of
      each global batch one after another (a multiple of the local replica count in every
      epoch); each part has ``"weight"`` float32 ``[b]``.

    Raises:
      TypeError: ``make_dataset``, ``batch_fn`` or ``map_fn`` is not callable.
      ValueError: unknown ``balance`` or ``shard_by``, or ``data_service`` with
        ``shard_by="batches"``.
    """
    for name, fn in (("make_dataset", make_dataset), ("batch_fn", batch_fn)):
        if not callable(fn):
            raise TypeError(f"{name} must be callable; received {name}={fn!r}")
    if map_fn is not None and not callable(map_fn):
        raise TypeError(f"map_fn must be callable or None; received map_fn={map_fn!r}")
    if shard_by not in SHARD_BY:
        raise ValueError(f"Unknown shard_by {shard_by!r}. Options: {list(SHARD_BY)}. "
                         f"Received: shard_by={shard_by!r}")
    if data_service is not None and shard_by != "files":
        raise ValueError("data_service shards through the service; use shard_by='files'. "
                         f"Received: shard_by={shard_by!r}, data_service={data_service!r}")
    split_batch(1, balance=balance, trim=trim, equal_rows=equal_rows)  # checks them now

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = _local_replicas(input_context)
        if shard_by == "batches":
            total = input_context.num_replicas_in_sync
            first = input_context.input_pipeline_id * local
            dataset = make_dataset(1, 0).apply(batch_fn(total))
            dataset = dataset.apply(split_batch(total, balance=balance, trim=trim,
                                                equal_rows=equal_rows))
            dataset = dataset.map(lambda *parts: parts[first:first + local])
        else:
            if data_service is not None:
                dataset = make_dataset(1, 0)
            else:
                dataset = make_dataset(input_context.num_input_pipelines,
                                       input_context.input_pipeline_id)
            dataset = dataset.apply(batch_fn(local))
            dataset = dataset.apply(split_batch(local, balance=balance, trim=trim,
                                                equal_rows=equal_rows))
            if data_service is not None:
                dataset = use_data_service(dataset, data_service, job_name=job_name)
        dataset = dataset.flat_map(lambda *parts: _one_after_another(parts))
        if map_fn is not None:
            dataset = dataset.map(map_fn, num_parallel_calls=tf.data.AUTOTUNE,
                                  deterministic=True)
        return dataset.prefetch(tf.data.AUTOTUNE)

    return dataset_fn


def multi_worker_strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
    """``MultiWorkerMirroredStrategy`` from ``TF_CONFIG``; call it before any other TF op.

    Raises:
      ValueError: ``TF_CONFIG`` is not set.
    """
    import os

    if not os.environ.get("TF_CONFIG"):
        raise ValueError("--strategy=multi_worker needs TF_CONFIG, e.g. "
                         '{"cluster": {"worker": ["localhost:12345", "localhost:12346"]}, '
                         '"task": {"type": "worker", "index": 0}}')
    return tf.distribute.MultiWorkerMirroredStrategy()


def to_replicas(strategy: tf.distribute.Strategy, parts: tuple):
    """Hands part ``i`` of one split batch to replica ``i`` (one worker).

    For loops that own a plain, checkpointable iterator over ``split_batch`` tuples instead of
    a distributed dataset (e.g. a resumable trainer calling ``model.train_on_batch``)::

        for parts in iterator:             # tuples of num_replicas parts, e.g. (x, y, w) each
            x, y, w = tfseq.to_replicas(strategy, parts)
            model.train_on_batch(x, y, sample_weight=w)

    Args:
      strategy: a single-worker strategy with ``len(parts)`` replicas.
      parts: a tuple with one element (any nest of tensors) per replica.

    Returns:
      The per-replica values, with ``parts[0]``'s structure.

    Raises:
      ValueError: ``len(parts)`` differs from ``strategy.num_replicas_in_sync``.
    """
    if len(parts) != strategy.num_replicas_in_sync:
        raise ValueError(f"Got {len(parts)} parts for {strategy.num_replicas_in_sync} replicas; "
                         "split with num_splits=strategy.num_replicas_in_sync")
    return strategy.experimental_distribute_values_from_function(
        lambda context: parts[context.replica_id_in_sync_group])


def _all_reduce_sum(value: tf.Tensor) -> tf.Tensor:
    """Sum of ``value`` over all replicas (itself outside a replica context)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def global_weighted_mean(values: tf.Tensor, weights: tf.Tensor | None = None) -> tf.Tensor:
    """This replica's share of the weighted mean of ``values`` over ALL replicas.

    ``sum(values * weights) / sum over replicas of sum(weights)``: summing the result (or its
    gradient) over replicas gives the weighted mean of the whole global batch, whatever the
    local batch sizes. Call it in replica context (inside ``strategy.run``, a Keras train
    step); elsewhere it is the plain weighted mean. The weight total carries no gradient.

    Args:
      values: float tensor, e.g. per-example losses ``[b]`` or per-token losses ``[b, T]``.
      weights: float tensor of ``values``' shape or a prefix of it (``[b]`` for ``[b, T]``,
        broadcast over the trailing axes); ``None`` weighs every value 1.

    Returns:
      A float scalar of ``values``' dtype; 0 when all weights everywhere are 0.
    """
    values = tf.convert_to_tensor(values)
    if weights is None:
        weights = tf.ones_like(values)
    weights = tf.cast(weights, values.dtype)
    if weights.shape.rank is not None and values.shape.rank is not None:
        for _ in range(values.shape.rank - weights.shape.rank):
            weights = weights[..., tf.newaxis]
    weights = tf.broadcast_to(weights, tf.shape(values))
    local_total = tf.reduce_sum(values * weights)
    weight_total = _all_reduce_sum(tf.stop_gradient(tf.reduce_sum(weights)))
    return tf.math.divide_no_nan(local_total, weight_total)


@keras.saving.register_keras_serializable(package="tfseq")
class GlobalWeightedLoss(keras.losses.Loss):
    """A Keras loss normalised by the sample weight summed over ALL replicas.

    Wraps a Keras loss (its ``call`` gives the unreduced losses) and returns
    ``global_weighted_mean(losses, sample_weight * mask)``. Keras sums gradients over
    replicas, so the update equals the single-device update on the global batch. Unlike
    the built-in reductions it does not divide by the local batch size or by the replica
    count, so dummy rows of weight 0 and uneven parts leave the loss unchanged.

    Pass the part's ``"weight"`` as ``sample_weight`` (the third element of the dataset
    tuple). Keras' logged training loss averages replicas by their row count, so it can
    differ slightly from the single-device value when parts differ in size; the gradients
    and weights are exact.

    Args:
      loss: the Keras loss to wrap, e.g.
        ``keras.losses.SparseCategoricalCrossentropy(from_logits=True)``, or a loss
        function or its name (``"sparse_categorical_crossentropy"``).
      name: name of this loss; defaults to ``"global_" + loss.name``.
      dtype: compute dtype, as for any Keras loss.
    """

    def __init__(self, loss, name: str | None = None, dtype=None):
        loss = keras.losses.get(loss)
        if not callable(loss):
            raise TypeError("GlobalWeightedLoss wraps a keras.losses.Loss, a loss function or "
                            f"a loss name; received loss={loss!r}")
        base_name = loss.name if isinstance(loss, keras.losses.Loss) else loss.__name__
        super().__init__(name=name or f"global_{base_name}", reduction="sum", dtype=dtype)
        self.loss = loss

    def call(self, y_true, y_pred):
        if isinstance(self.loss, keras.losses.Loss):
            return self.loss.call(y_true, y_pred)
        return self.loss(y_true, y_pred)

    def __call__(self, y_true, y_pred, sample_weight=None):
        in_mask = getattr(y_pred, "_keras_mask", None)
        with tf.name_scope(self.name):
            y_pred = tf.nest.map_structure(lambda x: tf.cast(x, self.dtype), y_pred)
            y_true = tf.nest.map_structure(lambda x: tf.cast(x, self.dtype), y_true)
            losses = self.call(y_true, y_pred)
            out_mask = getattr(losses, "_keras_mask", None)
            weights = None if sample_weight is None else tf.cast(sample_weight, losses.dtype)
            for mask in (in_mask, out_mask):
                if mask is not None:
                    mask = tf.cast(mask, losses.dtype)
                    weights = mask if weights is None else _times(weights, mask)
            if weights is not None and weights.shape.rank == losses.shape.rank + 1:
                weights = tf.squeeze(weights, -1)
            return global_weighted_mean(losses, weights)

    def get_config(self):
        return {"loss": keras.losses.serialize(self.loss), "name": self.name,
                "dtype": self._dtype_policy.name}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["loss"] = keras.losses.deserialize(config["loss"])
        return cls(**config)


def _times(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``a * b`` with the lower-rank one broadcast over the other's trailing axes."""
    while a.shape.rank < b.shape.rank:
        a = a[..., tf.newaxis]
    while b.shape.rank < a.shape.rank:
        b = b[..., tf.newaxis]
    return a * b


_WARNED_NON_LOOPBACK: set = set()


def _host_port(service: str) -> tuple[str, int]:
    """``("host", port)`` of ``"grpc://host:port"`` (IPv6 hosts in brackets)."""
    address = service.split("://", 1)[1]
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"service must look like 'grpc://host:port'; received service={service!r}")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _probe(service: str, host: str, port: int, timeout: float) -> None:
    """Raises ``ConnectionError`` naming ``service`` unless it accepts a TCP connection."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as error:
        raise ConnectionError(
            f"No tf.data service dispatcher reachable at {service} ({error}); start one with "
            "scripts/data_service.py or fix the address.") from error


def use_data_service(dataset: tf.data.Dataset, service: str, *,
                     processing_mode: str = "distributed_epoch",
                     job_name: str | None = None,
                     probe_timeout: float = 20.0) -> tf.data.Dataset:
    """Runs ``dataset`` on a tf.data service and returns the dataset its consumer reads.

    Everything already applied to ``dataset`` runs on the service's workers; what is applied
    afterwards runs on the trainer. With ``"distributed_epoch"`` the service splits the
    source (files from ``list_files``/``TextLineDataset``, ``range``,
    ``from_tensor_slices``) among its workers and every element is produced exactly once
    per epoch; order across workers is not kept. ``"parallel_epochs"`` runs a full epoch on
    every worker. Start a service with ``scripts/data_service.py``.

    Args:
      dataset: the dataset to move onto the service.
      service: the dispatcher address, ``"grpc://host:port"``.
      processing_mode: ``"distributed_epoch"`` or ``"parallel_epochs"``.
      job_name: consumers with the same job name share one job (their elements are
        disjoint under ``distributed_epoch``); ``None`` gives this consumer its own job.
      probe_timeout: seconds to wait for a TCP connection to the dispatcher before failing.
        TensorFlow's client retries an unreachable dispatcher forever, so tfseq checks the
        address first (only that it accepts connections: a dispatcher that dies later still
        makes the reader wait).

    Returns:
      The dataset read from the service, with ``dataset``'s element_spec.

    The service is unauthenticated and unencrypted: an address that is not a loopback one
    logs a warning once (see the trust model in docs/splitting.md).

    Raises:
      TypeError: ``dataset`` is not a Dataset, or ``service``/``job_name`` not a str.
      ValueError: ``service`` has no ``protocol://``, or ``processing_mode`` is unknown.
      ConnectionError: nothing accepts connections at ``service`` within ``probe_timeout``.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset; received {dataset!r}")
    if not isinstance(service, str):
        raise TypeError(f"service must be a str 'grpc://host:port'; received service={service!r}")
    if "://" not in service:
        raise ValueError(f"service must look like 'grpc://host:port'; received service={service!r}")
    if processing_mode not in PROCESSING_MODES:
        raise ValueError(f"Unknown processing_mode {processing_mode!r}. Options: "
                         f"{list(PROCESSING_MODES)}. Received: processing_mode={processing_mode!r}")
    if job_name is not None and not isinstance(job_name, str):
        raise TypeError(f"job_name must be a str or None; received job_name={job_name!r}")
    host, port = _host_port(service)
    if not _is_loopback(host) and service not in _WARNED_NON_LOOPBACK:
        _WARNED_NON_LOOPBACK.add(service)
        logging.warning(
            "tf.data service %s is not a loopback address: the service is unauthenticated and "
            "unencrypted, so anyone on that network can read this training data and run "
            "dataset graphs on the workers. Use it only on a trusted network (firewall, private "
            "subnet or SSH tunnel; see docs/splitting.md).", service)
    _probe(service, host, port, probe_timeout)
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=processing_mode, service=service, job_name=job_name))


def mirrored_strategy(num_replicas: int) -> tf.distribute.MirroredStrategy:
    """A ``MirroredStrategy`` over ``num_replicas`` GPUs, or logical CPU devices without GPUs.

    Without GPUs the host CPU is split into ``num_replicas`` logical devices, which TensorFlow
    allows only before it initialises its devices: call this before any other TF op.

    Args:
      num_replicas: number of replicas, a positive int.

    Raises:
      TypeError: ``num_replicas`` is not an int.
      ValueError: ``num_replicas`` is not positive, or more than the GPUs present.
      RuntimeError: no GPU, and the CPU devices were initialised with fewer logical devices.
    """
    check_positive_int("num_replicas", num_replicas)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if len(gpus) < num_replicas:
            raise ValueError(f"num_replicas={num_replicas} but only {len(gpus)} GPUs are visible")
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(num_replicas)])
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_replicas)])
    except RuntimeError as error:
        available = len(tf.config.list_logical_devices("CPU"))
        if available < num_replicas:
            raise RuntimeError(
                f"num_replicas={num_replicas} needs {num_replicas} logical CPU devices but "
                f"TensorFlow is already initialised with {available}; call mirrored_strategy "
                "before any other TensorFlow op.") from error
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(num_replicas)])
