"""PaddlePaddle MultiSlot text data feeds as tf.data: one dict of (ragged) tensors per line.

Format: every line holds the slots in a fixed order; each slot is a count followed by that many
values (Paddle's ``MultiSlotDataFeed``). ``uint64`` slots hold integer ids (read as int64),
``float`` slots hold decimal numbers (read as float32). A *sparse* slot has any number of
values (0 included); a *dense* slot has exactly ``prod(shape)`` values.

Worked example, slots ``click`` (uint64, dense, shape (1,)), ``words`` (uint64, sparse),
``price`` (float, dense, shape (2,))::

    line                            click   words        price
    "1 1   3 7 8 9   2 0.5 1.5"     [1]     [7, 8, 9]    [0.5, 1.5]
    "1 0   0         2 2.0 -1"      [0]     []           [2.0, -1.0]
    "1 1   1 42      2 1e3 0"       [1]     [42]         [1000.0, 0.0]

and batched (``batch_size=3``): ``click`` int64 ``[3, 1]``, ``words`` int64 RaggedTensor
``[3, (n)]`` = ``[[7, 8, 9], [], [42]]``, ``price`` float32 ``[3, 2]``.

Malformed lines. Each is classified by the first problem found, left to right:

    reason            the line ...
    missing_slot      ends before a slot (an empty line is missing its first slot)
    bad_count         has a count that is not a non-negative integer
    count_too_large   has a count larger than the tokens left on the line
    non_numeric       has a value that is not a uint64 id (digits, <= 2**64 - 1) or a finite float
    dense_size        has a dense slot whose count is not prod(shape)
    extra_tokens      has tokens left after the last slot

``on_error="raise"`` (default) stops with ``tf.errors.InvalidArgumentError`` whose message
names the file, the 1-based line number, the slot and the reason; ``on_error="drop"`` drops the
line and counts it under its reason in the ``DropCounter`` (``counter.drops()``).

Files are read ``num_parallel_reads`` at a time, interleaved line by line (Paddle's reader
threads). ``pipe_command`` (an argv list, never a shell string) preprocesses each file before
the graph runs, as Paddle's ``pipe_command`` does: the file's bytes (decompressed first for a
``.gz`` file, as Paddle's ``zcat``) go to the command's stdin,
its stdout is written to a file under ``pipe_dir`` and that file is parsed. The commands run in
Python (one subprocess per file, ``num_parallel_reads`` at a time) when ``read`` is called; a
command that is not found raises ``FileNotFoundError`` and a non-zero exit raises
``PipeCommandError``, both naming the file and the command. The parsing itself is tf ops only.

Paddle compatibility (see docs/paddle.md): ids cover the whole uint64 range and are bit-cast
to int64 as Paddle does (2**64 - 1 reads as -1); ``slots_from_paddle`` / ``slots_from_desc``
take Paddle's ``set_use_var`` / ``DataFeedDesc`` declarations (``is_used: false`` slots are
parsed, not emitted); ``parse_ins_id`` / ``parse_content`` read the ``1 <token>`` prefixes;
``reader="in_memory"`` matches ``MultiSlotInMemoryDataFeed`` (sparse slots lose id 0 and
``|x| < 1e-6``, an emptied slot holds one 0), ``reader="queue"`` (default) ``MultiSlotDataFeed``.

Shapes: B = batch, n = values of a sparse slot in one line.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gzip
import math
import os
import re
import shutil
import subprocess
import tempfile
from typing import Sequence

import tensorflow as tf
from absl import logging

from tfseq._common import check_positive_int, unbatch
from tfseq.reading import resolve_files, verify_gzip
from tfseq.stats import resolve_counter

__all__ = ["Slot", "REASONS", "READERS", "PipeCommandError", "parse", "read", "run_pipe_command",
           "format_line", "slots_from_paddle", "slots_from_desc"]

TYPES = ("uint64", "float")
KINDS = ("sparse", "dense")
REASONS = ("missing_slot", "bad_count", "count_too_large", "non_numeric", "dense_size",
           "extra_tokens")
_CODE = {reason: i + 1 for i, reason in enumerate(REASONS)}  # 0 means "ok"
_UINT64_MAX_HEAD, _UINT64_MAX_TAIL = divmod(2 ** 64 - 1, 10 ** 10)
_FLOAT_RE = r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"
_MAX_COUNT = 1 << 31
READERS = ("queue", "in_memory")


@dataclasses.dataclass(frozen=True)
class Slot:
    """One MultiSlot column.

    Attributes:
      name: feature name in the output dict.
      type: ``"uint64"`` (ids, emitted as int64) or ``"float"`` (emitted as float32).
      kind: ``"sparse"`` (any number of values: ``[(n)]`` per line, RaggedTensor ``[B, (n)]``
        batched) or ``"dense"`` (exactly ``prod(shape)`` values: ``shape`` per line).
      shape: dense slots only: the per-line shape, e.g. ``(1,)`` or ``(4,)``; ``()`` is a scalar.
      used: ``False`` (Paddle's ``is_used: false``): the slot is parsed and checked but not
        emitted.
    """

    name: str
    type: str = "uint64"
    kind: str = "sparse"
    shape: tuple[int, ...] = ()
    used: bool = True

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Slot name must be a non-empty str; received name={self.name!r}")
        if self.type not in TYPES:
            raise ValueError(f"Slot {self.name!r}: unknown type {self.type!r}; expected one of "
                             f"{TYPES}")
        if self.kind not in KINDS:
            raise ValueError(f"Slot {self.name!r}: unknown kind {self.kind!r}; expected one of "
                             f"{KINDS}")
        shape = tuple(self.shape) if isinstance(self.shape, (tuple, list)) else self.shape
        if not isinstance(shape, tuple) or any(
                isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in shape):
            raise ValueError(f"Slot {self.name!r}: shape must be a tuple of positive ints; "
                             f"received shape={self.shape!r}")
        if self.kind == "sparse" and shape:
            raise ValueError(f"Slot {self.name!r}: a sparse slot has no shape (its length varies "
                             f"per line); received shape={self.shape!r}")
        object.__setattr__(self, "shape", shape)

    @property
    def size(self) -> int:
        """Values per line of a dense slot."""
        return math.prod(self.shape)

    @property
    def dtype(self) -> tf.DType:
        return tf.int64 if self.type == "uint64" else tf.float32


def _check_slots(slots) -> tuple[Slot, ...]:
    if isinstance(slots, (str, Slot)) or not isinstance(slots, Sequence) or not slots:
        raise TypeError(f"slots must be a non-empty list of Slot (or (name, type, kind[, shape"
                        f"[, used]]) tuples); received slots={slots!r}")
    out = []
    for slot in slots:
        if isinstance(slot, Slot):
            out.append(slot)
        elif isinstance(slot, (tuple, list)) and 1 <= len(slot) <= 5:
            out.append(Slot(*slot))
        else:
            raise TypeError(f"Each slot must be a Slot or a (name, type, kind[, shape[, used]]) "
                            f"tuple; received {slot!r}")
    names = [s.name for s in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"Slot names must be unique; duplicated: {duplicates}")
    if not any(s.used for s in out):
        raise ValueError("At least one slot must be used (used=True / is_used: true)")
    return tuple(out)


_PADDLE_DTYPES = {"int64": "uint64", "uint64": "uint64", "float32": "float", "float": "float"}


def slots_from_paddle(use_vars) -> tuple[Slot, ...]:
    """Slots from Paddle's ``dataset.set_use_var`` declarations, in the same order.

    Args:
      use_vars: ``(name, dtype, lod_level, shape)`` tuples, as the variables passed to
        ``set_use_var`` were declared (``paddle.static.data(name, shape, dtype, lod_level)``):
        dtype ``"int64"`` or ``"float32"``; ``lod_level`` 1 is a sparse slot, 0 a dense one whose
        shape is ``shape`` without its leading batch dimension (``-1`` / ``None``), e.g.
        ``("click", "int64", 0, [-1, 1])`` -> ``Slot("click", "uint64", "dense", (1,))``.

    Returns:
      tuple of ``Slot``.

    Raises:
      ValueError: an unknown dtype, a lod_level other than 0/1, or a dense shape that is not
        fully known.
    """
    out = []
    for var in use_vars:
        if not isinstance(var, (tuple, list)) or len(var) != 4:
            raise TypeError(f"slots_from_paddle: each entry must be (name, dtype, lod_level, "
                            f"shape); received {var!r}")
        name, dtype, lod_level, shape = var
        if str(dtype) not in _PADDLE_DTYPES:
            raise ValueError(f"slots_from_paddle: var {name!r} has dtype {dtype!r}; MultiSlot "
                             f"feeds hold {sorted(_PADDLE_DTYPES)}")
        if lod_level == 1:
            out.append(Slot(name, _PADDLE_DTYPES[str(dtype)], "sparse"))
        elif lod_level == 0:
            dims = list(shape or [])
            if dims and dims[0] in (-1, None):
                dims = dims[1:]
            if not dims or any(d in (-1, None) for d in dims):
                raise ValueError(f"slots_from_paddle: dense var {name!r} needs a known shape "
                                 f"after the batch dimension; received shape={shape!r}")
            out.append(Slot(name, _PADDLE_DTYPES[str(dtype)], "dense", tuple(dims)))
        else:
            raise ValueError(f"slots_from_paddle: var {name!r} has lod_level={lod_level!r}; "
                             f"MultiSlot feeds use 0 (dense) or 1 (sparse)")
    return _check_slots(out)


def _desc_field(body: str, key: str):
    return [m.group(1).strip('"') for m in re.finditer(rf"\b{key}\s*:\s*(\"[^\"]*\"|\S+)", body)]


def slots_from_desc(text: str, dense_shapes: dict | None = None) -> tuple[Slot, ...]:
    """Slots from a Paddle ``DataFeedDesc`` text proto (``multi_slot_desc { slots {...} }``).

    Each ``slots { name type is_dense is_used [shape] }`` block becomes one ``Slot`` in order;
    ``is_used: false`` slots are parsed but not emitted. A dense slot takes its shape from its
    ``shape:`` entries (a leading ``-1`` dropped), else from ``dense_shapes[name]``, else
    ``(1,)`` (Paddle sizes a dense slot from the data; tfseq needs it up front).

    Raises:
      ValueError: no slot found, or a block without ``name``/``type``.
    """
    blocks = re.findall(r"slots\s*\{([^{}]*)\}", text)
    if not blocks:
        raise ValueError("slots_from_desc: no 'slots { ... }' block in the DataFeedDesc text")
    dense_shapes = dict(dense_shapes or {})
    out = []
    for body in blocks:
        name, kind = _desc_field(body, "name"), _desc_field(body, "type")
        if not name or not kind:
            raise ValueError(f"slots_from_desc: a slots block needs name and type: {body!r}")
        dense = (_desc_field(body, "is_dense") or ["false"])[0] == "true"
        used = (_desc_field(body, "is_used") or ["false"])[0] == "true"
        if dense:
            dims = [int(d) for d in _desc_field(body, "shape")]
            if dims and dims[0] == -1:
                dims = dims[1:]
            shape = tuple(dims) or tuple(dense_shapes.get(name[0], (1,)))
            out.append(Slot(name[0], kind[0], "dense", shape, used))
        else:
            out.append(Slot(name[0], kind[0], "sparse", (), used))
    return _check_slots(out)


def _parse_uint64(tokens: tf.Tensor):
    """(ok bool [K], int64 [K]): digit strings up to 2**64 - 1, bit-cast to int64 as Paddle does.

    Ids 2**63 .. 2**64 - 1 read as negative int64 (2**64 - 1 -> -1), exactly like Paddle's
    ``strtoull`` followed by a cast to int64. Signs, other characters and values past
    2**64 - 1 -> (False, 0).
    """
    digits = tf.strings.regex_full_match(tokens, "[0-9]+")
    text = tf.where(digits, tf.strings.regex_replace(tokens, "^0+([0-9])", r"\1"), "0")
    length = tf.strings.length(text)
    ok = digits & (length <= 20)
    # Up to 20 digits: a head of length - 10 digits and a tail of the last 10; both fit int64.
    padded = tf.where(ok, tf.strings.join([tf.fill(tf.shape(text), "0" * 20), text]), "0" * 21)
    padded = tf.strings.substr(padded, -20, 20)
    head = tf.strings.to_number(tf.strings.substr(padded, 0, 10), tf.int64)
    tail = tf.strings.to_number(tf.strings.substr(padded, 10, 10), tf.int64)
    ok = ok & ((head < _UINT64_MAX_HEAD) |
               ((head == _UINT64_MAX_HEAD) & (tail <= _UINT64_MAX_TAIL)))
    value = (tf.cast(tf.where(ok, head, 0), tf.uint64) * tf.constant(10 ** 10, tf.uint64)
             + tf.cast(tf.where(ok, tail, 0), tf.uint64))
    return ok, tf.bitcast(value, tf.int64)


def _parse_float(tokens: tf.Tensor):
    """(ok bool [K], float32 [K]): finite decimal numbers; others -> (False, 0)."""
    ok = tf.strings.regex_full_match(tokens, _FLOAT_RE)
    value = tf.strings.to_number(tf.where(ok, tokens, "0"), tf.float32)
    ok = ok & tf.math.is_finite(value)
    return ok, tf.where(ok, value, 0.0)


def _detail_table(slots: tuple[Slot, ...]) -> list[list[str]]:
    """``[reason code][slot index]`` -> human-readable reason (row 0: ok)."""
    n = len(slots)
    table = [[""] * (n + 1)]
    for reason in REASONS:
        row = []
        for k, slot in enumerate(slots):
            where = f"{reason}: slot {slot.name} ({k + 1} of {n}, {slot.type} {slot.kind}"
            where += f" {slot.shape})" if slot.kind == "dense" else ")"
            what = {
                "missing_slot": "the line ends before this slot",
                "bad_count": "its count is not a non-negative integer",
                "count_too_large": "its count is larger than the number of tokens left",
                "non_numeric": ("a value is not an id (digits, at most 2**64 - 1)" if slot.type ==
                                "uint64" else "a value is not a finite decimal number"),
                "dense_size": f"a dense slot of shape {slot.shape} needs a count of {slot.size}",
                "extra_tokens": "",
            }[reason]
            row.append(f"{where}: {what}")
        row.append(f"{reason}: tokens are left after the last slot ({slots[-1].name})")
        table.append(row)
    return table


def _in_memory(values, slot: Slot):
    """MultiSlotInMemoryDataFeed's sparse-slot rule: drop id 0 / |x| < 1e-6, refill empty with 0."""
    if slot.type == "uint64":
        keep = tf.not_equal(values.values, 0)
    else:
        keep = tf.abs(values.values) >= 1e-6
    kept = tf.ragged.boolean_mask(values, values.with_values(keep))
    empty = tf.equal(kept.row_lengths(), 0)
    refill = tf.RaggedTensor.from_row_lengths(
        tf.zeros([tf.reduce_sum(tf.cast(empty, tf.int64))], values.dtype),
        tf.cast(empty, tf.int64))
    return tf.concat([kept, refill], axis=1)


def parse(lines, slots, *, reader: str = "queue", parse_ins_id: bool = False,
          parse_content: bool = False):
    """Parses a batch of MultiSlot lines with tf ops (vectorized over the batch).

    Args:
      lines: string tensor ``[B]``.
      slots: list of ``Slot`` (or ``(name, type, kind[, shape[, used]])`` tuples), in line order.
      reader: which Paddle reader to match (``READERS``): ``"queue"`` (``MultiSlotDataFeed``,
        ``QueueDataset``) keeps every value; ``"in_memory"`` (``MultiSlotInMemoryDataFeed``,
        ``InMemoryDataset``) drops id 0 and floats with ``|x| < 1e-6`` from sparse slots and
        refills a slot left empty with one 0.
      parse_ins_id: the line starts with an instance id written as Paddle writes it, ``1 <id>``
        (Paddle's ``parse_ins_id``), emitted as string feature ``"ins_id"`` ``[B]``.
      parse_content: then a content field ``1 <token>`` (Paddle's ``parse_content``), emitted
        as string feature ``"content"`` ``[B]``. A line without a prefix it should have fails
        as ``missing_slot`` at the first slot (Paddle aborts the process).

    Returns:
      ``(features, errors, error_slots)``: ``features`` maps each slot name to int64/float32
      RaggedTensor ``[B, (n)]`` (sparse) or tensor ``[B, *shape]`` (dense); ``errors`` is int32
      ``[B]``, 0 for a good line, else ``1 + REASONS.index(reason)``; ``error_slots`` is int32
      ``[B]``, the index of the slot where the problem was found (``len(slots)`` for
      ``extra_tokens``). Values of a bad line are unspecified (zeros or partial).

    Raises:
      TypeError / ValueError: bad ``slots``.
    """
    slots = _check_slots(slots)
    if reader not in READERS:
        raise ValueError(f"reader must be one of {READERS}; received reader={reader!r}")
    lines = tf.convert_to_tensor(lines, tf.string)
    prefixes = {}
    for key, wanted in (("ins_id", parse_ins_id), ("content", parse_content)):
        if wanted:
            if any(s.name == key for s in slots if s.used):
                raise ValueError(f"A slot named {key!r} clashes with parse_{key}")
            # Paddle writes each prefix as a count of 1 and the token: "1 <token>". A line
            # without it is emptied, so it fails as missing_slot at the first slot.
            has = tf.strings.regex_full_match(lines, r"\s*1\s+\S+(\s.*)?")
            prefixes[key] = tf.where(
                has, tf.strings.regex_replace(lines, r"^\s*1\s+(\S+).*$", r"\1"), "")
            lines = tf.where(has, tf.strings.regex_replace(lines, r"^\s*1\s+\S+", ""), "")
    tokens = tf.strings.split(lines)                                  # [B, (N)]
    num_rows = tokens.nrows(out_type=tf.int32)
    num_tokens = tokens.row_lengths()
    starts = tokens.row_starts()
    # Every token is parsed once, as an id and (when a float slot exists) as a float; slots
    # then only gather. One sentinel token ("", never valid) after the end keeps the gathers
    # of bad rows in range.
    flat = tf.concat([tokens.values, [""]], 0)
    sentinel = tf.size(tokens.values, out_type=tf.int64)
    parsed = {"uint64": _parse_uint64(flat)}
    if any(slot.type == "float" for slot in slots):
        parsed["float"] = _parse_float(flat)
    id_ok, id_value = parsed["uint64"]
    pos = tf.zeros_like(num_tokens)
    errors = tf.zeros([num_rows], tf.int32)
    error_slots = tf.zeros([num_rows], tf.int32)

    def fail(fires, reason, k):
        nonlocal errors, error_slots
        new = tf.logical_and(fires, tf.equal(errors, 0))
        errors = tf.where(new, _CODE[reason], errors)
        error_slots = tf.where(new, k, error_slots)

    features = {}
    for k, slot in enumerate(slots):
        fail(pos >= num_tokens, "missing_slot", k)
        at = tf.where(tf.equal(errors, 0), starts + pos, sentinel)
        count = tf.gather(id_value, at)
        fail(tf.logical_not(tf.gather(id_ok, at) & (count >= 0) & (count < _MAX_COUNT)),
             "bad_count", k)
        fail(pos + 1 + count > num_tokens, "count_too_large", k)
        if slot.kind == "dense":
            fail(tf.not_equal(count, slot.size), "dense_size", k)
        good = tf.equal(errors, 0)
        count = tf.where(good, count, 0)
        first = starts + pos + 1
        ok, value = parsed[slot.type]
        if slot.kind == "dense":
            at = first[:, None] + tf.range(slot.size, dtype=tf.int64)[None, :]     # [B, size]
            at = tf.where(good[:, None], at, sentinel)
            fail(tf.logical_not(tf.reduce_all(tf.gather(ok, at), axis=1)), "non_numeric", k)
            values = tf.reshape(tf.gather(value, at), [num_rows, *slot.shape])
        else:
            at = tf.ragged.range(first, first + count)                          # [B, (n)]
            bad = tf.math.unsorted_segment_max(
                tf.cast(tf.logical_not(tf.gather(ok, at.values)), tf.int32),
                at.value_rowids(), num_rows)
            fail(bad > 0, "non_numeric", k)
            values = at.with_values(tf.gather(value, at.values))
            if reader == "in_memory":
                values = _in_memory(values, slot)
        if slot.used:
            features[slot.name] = values
        pos = pos + 1 + count
    fail(tf.not_equal(pos, num_tokens), "extra_tokens", len(slots))
    features.update(prefixes)
    return features, errors, error_slots


class PipeCommandError(RuntimeError):
    """A ``pipe_command`` exited with a non-zero status (the message names file and command)."""


def _check_argv(pipe_command) -> list[str]:
    if isinstance(pipe_command, (str, bytes)) or not isinstance(pipe_command, Sequence) or (
            not pipe_command) or not all(isinstance(a, str) for a in pipe_command):
        raise TypeError(
            "pipe_command must be a non-empty argv list of str such as ['sed', 's/a/b/'] (it is "
            f"run without a shell; use shlex.split for a command line); received {pipe_command!r}")
    return list(pipe_command)


def run_pipe_command(pipe_command: Sequence[str], path: str, out_path: str) -> None:
    """Runs ``pipe_command`` with ``path``'s bytes on stdin and its stdout into ``out_path``.

    A ``.gz`` file is decompressed first (Paddle pipes it through ``zcat`` before the command),
    so ``pipe_command=["cat"]`` (Paddle's default) reads a gzip feed as plain text.

    Raises:
      FileNotFoundError: the command (``pipe_command[0]``) is not found; names file and command.
      PipeCommandError: the command exits with a non-zero status; names file, command, status
        and the end of its stderr.
    """
    argv = _check_argv(pipe_command)
    if path.endswith(".gz"):
        verify_gzip(path)
    try:
        with open(out_path, "wb") as stdout, tempfile.TemporaryFile() as stderr:
            if path.endswith(".gz"):
                # Paddle's fs layer pipes a .gz file through zcat before the pipe command.
                process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=stdout,
                                           stderr=stderr)
                try:
                    with gzip.open(path, "rb") as source:
                        shutil.copyfileobj(source, process.stdin, 1 << 20)
                except BrokenPipeError:
                    pass  # the command stopped reading; its exit status tells the rest
                finally:
                    process.stdin.close()
                returncode = process.wait()
            else:
                with open(path, "rb") as stdin:
                    returncode = subprocess.run(argv, stdin=stdin, stdout=stdout, stderr=stderr,
                                                check=False).returncode
            stderr.seek(0)
            err = stderr.read()
    except FileNotFoundError as e:
        if not os.path.exists(path):
            raise
        raise FileNotFoundError(f"pipe_command {argv!r} for file {path!r}: command {argv[0]!r} "
                                f"not found ({e.strerror})") from e
    except PermissionError as e:
        raise PipeCommandError(f"pipe_command {argv!r} for file {path!r}: command {argv[0]!r} "
                               f"cannot be run ({e.strerror})") from e
    if returncode != 0:
        stderr = err.decode("utf-8", "replace").strip()[-500:]
        raise PipeCommandError(f"pipe_command {argv!r} exited with status {returncode} "
                               f"on file {path!r}" + (f": {stderr}" if stderr else ""))


def _piped(files, pipe_command, pipe_dir, workers):
    argv = _check_argv(pipe_command)
    if shutil.which(argv[0]) is None:
        raise FileNotFoundError(f"pipe_command {argv!r}: command {argv[0]!r} not found on PATH "
                                f"(needed for file {files[0]!r})")
    if pipe_dir is None:
        pipe_dir = tempfile.mkdtemp(prefix="tfseq_multislot_")
    os.makedirs(pipe_dir, exist_ok=True)
    outputs = [os.path.join(pipe_dir, f"{i:05d}_{os.path.basename(f)}.txt")
               for i, f in enumerate(files)]
    logging.info("multislot: running pipe_command %s on %d files into %s", argv, len(files),
                 pipe_dir)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(run_pipe_command, argv, f, o) for f, o in zip(files, outputs)]:
            future.result()
    return outputs


def format_line(slots, values: dict) -> str:
    """One MultiSlot line from ``{slot name: list of values}`` (for writing data sets).

    Raises:
      ValueError: a slot is missing from ``values`` or a dense slot has the wrong size.
    """
    slots = _check_slots(slots)
    parts = []
    for slot in slots:
        if slot.name not in values:
            raise ValueError(f"format_line: no values for slot {slot.name!r}")
        vals = list(values[slot.name])
        if slot.kind == "dense" and len(vals) != slot.size:
            raise ValueError(f"format_line: dense slot {slot.name!r} needs {slot.size} values; "
                             f"received {len(vals)}")
        text = [str(int(v)) if slot.type == "uint64" else repr(float(v)) for v in vals]
        parts.append(" ".join([str(len(vals))] + text))
    return " ".join(parts)


def read(patterns, slots, *, on_error: str = "raise", counter=None, batch_size: int | None = None,
         num_parallel_reads: int | None = None, deterministic: bool | None = None,
         pipe_command: Sequence[str] | None = None, pipe_dir: str | None = None,
         compression: str | None = None, parse_batch_size: int = 256, reader: str = "queue",
         parse_ins_id: bool = False, parse_content: bool = False,
         shuffle_lines: bool = False, seed: int | None = None,
         shuffle_buffer: int = 65536) -> tf.data.Dataset:
    """Dataset of the parsed lines of MultiSlot files.

    Args:
      patterns: a path or glob, or a list of them (sorted per pattern).
      slots: list of ``Slot`` (or ``(name, type, kind[, shape])`` tuples), in line order.
      on_error: ``"raise"``: a malformed line stops iteration with
        ``tf.errors.InvalidArgumentError`` naming file, line number, slot and reason;
        ``"drop"``: it is dropped and counted by reason (``REASONS``) in ``counter``.
      counter: a ``tfseq.DropCounter``: ``seen()["lines_read"]`` counts the lines read and, with
        ``on_error="drop"``, ``drops()`` the dropped lines by reason (every reason in
        ``REASONS`` is registered, so it is reported even at 0). Default with ``"drop"``: the
        process-wide counter; with ``"raise"``: none.
      batch_size: ``None`` yields one example per line (sparse slots ``[(n)]``, dense slots
        ``shape``); an int yields batches (sparse: RaggedTensor ``[B, (n)]``; dense
        ``[B, *shape]``), the last one smaller.
      num_parallel_reads: files read at once, interleaved line by line (default: all files, at
        most 16).
      deterministic: ``None`` follows ``tf.data.Options.deterministic`` (deterministic by
        default); ``False`` lets files and parse workers deliver out of order for speed, like
        Paddle's reader threads. Every line is delivered exactly once either way.
      pipe_command: argv list run per file before reading (see the module docstring).
      pipe_dir: where piped outputs are written (default: a new temporary directory, kept).
      compression: ``None`` (gzip when the name ends in ``.gz``), ``"GZIP"`` or ``""``; ignored
        for piped files, whose output is read as plain text.
      parse_batch_size: lines parsed per vectorized parse call.
      reader: ``"queue"`` (default, Paddle's ``QueueDataset``) or ``"in_memory"`` (Paddle's
        ``InMemoryDataset``: sparse slots lose id 0 / ``|x| < 1e-6`` and an emptied slot holds
        one 0); see ``parse``.
      parse_ins_id / parse_content: the lines start with an instance id / a content token
        (Paddle's flags of the same names), emitted as string features ``"ins_id"`` /
        ``"content"``.
      shuffle_lines: mix the lines (across files) before parsing, in a buffer of
        ``shuffle_buffer`` lines (Paddle's ``local_shuffle``; see docs/paddle.md for
        ``global_shuffle``). Error messages still name each line's file and number.
      seed: seed of ``shuffle_lines`` (same seed, same order when deterministic).
      shuffle_buffer: lines held by the ``shuffle_lines`` buffer.

    Returns:
      ``tf.data.Dataset`` of ``{slot name: tensor}``.

    Raises:
      FileNotFoundError: a pattern matches nothing, or the pipe command is not found.
      ValueError: a truncated or corrupt gzip file (checked before the graph runs).
      PipeCommandError: the pipe command fails on a file.
      TypeError / ValueError: bad arguments (named in the message).
    """
    slots = _check_slots(slots)
    if reader not in READERS:
        raise ValueError(f"reader must be one of {READERS}; received reader={reader!r}")
    if on_error not in ("raise", "drop"):
        raise ValueError(f"on_error must be 'raise' or 'drop'; received on_error={on_error!r}")
    check_positive_int("batch_size", batch_size, allow_none=True)
    check_positive_int("num_parallel_reads", num_parallel_reads, allow_none=True)
    check_positive_int("parse_batch_size", parse_batch_size)
    if compression not in (None, "", "GZIP"):
        raise ValueError(f"compression must be None, '' or 'GZIP'; received {compression!r}")
    if on_error == "drop":
        counter = resolve_counter(counter)
    files = resolve_files(patterns)
    cycle = num_parallel_reads or min(len(files), 16)
    names = list(files)
    if pipe_command is not None:
        files = _piped(files, pipe_command, pipe_dir, cycle)
        names = [f"{n} (after pipe_command {list(pipe_command)!r})" for n in names]
        kinds = [""] * len(files)
    else:
        kinds = [("GZIP" if f.endswith(".gz") else "") if compression is None else compression
                 for f in files]
        for path, kind in zip(files, kinds):
            if kind == "GZIP":
                verify_gzip(path)

    lines_read = counter.tally("lines_read") if counter is not None else None

    @tf.autograph.experimental.do_not_convert
    def read_file(name, path, kind):
        lines = tf.data.TextLineDataset(path, compression_type=kind)
        if counter is not None:
            lines = lines.apply(lines_read)
        return lines.enumerate(start=1).map(lambda i, line: (name, i, line))

    file_ds = tf.data.Dataset.from_tensor_slices((names, files, kinds))
    lines = file_ds.interleave(read_file, cycle_length=cycle, block_length=1,
                               num_parallel_calls=cycle if cycle > 1 else None,
                               deterministic=deterministic if cycle > 1 else None)
    if shuffle_lines:
        check_positive_int("shuffle_buffer", shuffle_buffer)
        lines = lines.shuffle(shuffle_buffer, seed=seed)
    details = tf.constant(_detail_table(slots))
    if on_error == "drop":
        counter.register(*REASONS)
    # Raising never changes a chunk's size, so chunks can be the batches themselves.
    direct = bool(batch_size) and on_error == "raise"
    chunk = batch_size if direct else parse_batch_size

    @tf.autograph.experimental.do_not_convert
    def parse_chunk(name, line_number, line):
        features, errors, error_slots = parse(line, slots, reader=reader,
                                              parse_ins_id=parse_ins_id,
                                              parse_content=parse_content)
        if on_error == "raise":
            bad = tf.argmax(tf.cast(tf.not_equal(errors, 0), tf.int32), output_type=tf.int32)
            message = tf.strings.join([
                "MultiSlot parse error in ", name[bad], " line ",
                tf.strings.as_string(line_number[bad]), ": ",
                tf.gather_nd(details, [errors[bad], error_slots[bad]]), ". Line: ",
                # Cut at 200 bytes, then made valid UTF-8 (a bad byte or a split character
                # becomes U+FFFD) so the message itself can always be decoded.
                tf.strings.unicode_transcode(tf.strings.substr(line[bad], 0, 200), "UTF-8",
                                             "UTF-8", errors="replace")])
            check = tf.debugging.Assert(tf.reduce_all(tf.equal(errors, 0)), [message])
            with tf.control_dependencies([check]):
                return tf.nest.map_structure(tf.identity, features)
        updates = [counter.count(reason, tf.reduce_sum(tf.cast(tf.equal(errors, code), tf.int64)))
                   for reason, code in _CODE.items()]
        keep = tf.equal(errors, 0)
        with tf.control_dependencies(updates):
            return {k: (tf.ragged.boolean_mask(v, keep) if isinstance(v, tf.RaggedTensor)
                        else tf.boolean_mask(v, keep)) for k, v in features.items()}

    ds = lines.batch(chunk).map(parse_chunk, num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=deterministic)
    if direct:
        return ds
    ds = unbatch(ds)
    if batch_size:
        ds = ds.ragged_batch(batch_size)
    return ds
