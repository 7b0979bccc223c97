"""From ``tfseq-train``'s flags to a task's ``Config``, and messages that name those flags.

``build_config(task, flag_values)`` applies every explicitly given flag to the task's
``Config`` and refuses flags the task does not use or that conflict (``app.UsageError``, one
line naming the flag). ``changed_run_message`` words a ``runs.ChangedRun`` in flag names.
"""

from __future__ import annotations

import dataclasses
import os

from absl import app

# Flag -> task Config field. A flag given explicitly must exist in the task's Config.
CONFIG_FLAGS = {
    "files": "files", "vocab": "vocab_path", "batching": "batching", "batch_size": "batch_size",
    "max_tokens": "max_tokens", "max_length": "max_length", "block_length": "block_length",
    "boundaries": "boundaries", "seed": "seed", "tbptt": "tbptt",
    "train_files": "train_files", "eval_files": "eval_files", "format": "format",
    "columns": "columns", "header": "header", "eval_percent": "eval_percent",
    "source_files": "source_files", "target_files": "target_files", "tokenizer": "tokenizer",
    "vocab_size": "vocab_size", "vocab_max_lines": "vocab_max_lines",
    "long_examples": "long_examples", "shuffle_shard_bytes": "shuffle_shard_bytes",
    "mix_temperature": "mix_temperature", "jit_compile": "jit_compile",
}
FLAG_OF_FIELD = {field: flag for flag, field in CONFIG_FLAGS.items()}
FLAG_OF_FIELD["train_weights"] = "train_files weights"
LIST_FLAGS = ("files", "train_files", "eval_files", "columns", "source_files", "target_files")
INT_LIST_FLAGS = ("block_length", "boundaries")
PATH_FLAGS = ("files", "train_files", "eval_files", "source_files", "target_files", "vocab",
              "model_dir")


def absolute(value):
    """A path (or a tuple or list of paths or globs) made absolute; ``None`` stays."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return type(value)(os.path.abspath(v) for v in value)
    return os.path.abspath(value)


def build_config(task, flag_values):
    """The task's Config with every explicitly given flag applied.

    Raises:
      app.UsageError: a flag the task does not use, or flags that conflict.
    """
    fields = {f.name for f in dataclasses.fields(task.Config)}
    values = {}
    for flag_name, field in CONFIG_FLAGS.items():
        flag = flag_values[flag_name]
        if not flag.present or flag.value == flag.default:  # a flagfile repeats the defaults
            continue
        if field not in fields:
            raise app.UsageError(f"--{flag_name} is not used by --task={flag_values.task} "
                                 f"(its options: {sorted(fields)})")
        value = flag.value
        if flag_name in LIST_FLAGS:
            value = tuple(value)
        if flag_name in INT_LIST_FLAGS:
            value = tuple(sorted({int(v) for v in value}))
            if flag_name == "block_length" and len(value) == 1:
                value = value[0]
        if flag_name in ("train_files", "source_files"):  # GLOB@WEIGHT: a mixture
            value, weights = _split_weights(value, f"--{flag_name}")
            if weights and "train_weights" not in fields:
                raise app.UsageError(f"--task={flag_values.task} trains on one source: "
                                     "--train_files entries take no @WEIGHT")
            if weights:
                values["train_weights"] = weights
        if flag_name in PATH_FLAGS:  # the run's files whatever the directory it runs from
            value = absolute(value)
        values[field] = value
    config = dataclasses.replace(task.Config(), **values)
    batching = getattr(config, "batching", "pad")
    for name, mode in (("batch_size", "pad"), ("block_length", "pack"), ("boundaries", "bucket")):
        flag = flag_values[name]
        if flag.present and flag.value != flag.default and batching != mode:
            hint = " (use --max_tokens for a token budget)" if name == "batch_size" else ""
            raise app.UsageError(f"--{name} applies to --batching={mode}, not "
                                 f"--batching={batching}{hint}")
    if flag_values.max_tokens is not None and batching == "pad":
        raise app.UsageError("--max_tokens applies to --batching=bucket or pack, not "
                             "--batching=pad (use --batch_size)")
    if flag_values.max_tokens is not None and flag_values.max_tokens <= 0:
        raise app.UsageError(f"--max_tokens must be a positive number of tokens per batch; "
                             f"received {flag_values.max_tokens}")
    check_no_effect(config, flag_values)
    return config


def _split_weights(entries, flag):
    from tfseq.errors import InputError
    from tfseq.pipelines.mixture import split_weights

    try:
        return split_weights(entries, flag)
    except InputError as e:
        raise app.UsageError(str(e)) from None


def check_no_effect(config, flag_values) -> None:
    """A flag that would be silently ignored with the other flags given is an error naming it."""
    user = bool(getattr(config, "train_files", ())) or bool(getattr(config, "source_files", ()))
    for name in ("eval_files", "format", "columns", "header"):
        # (ctr has eval_files of its own, next to --files, and no train_files)
        if flag_values[name].value and hasattr(config, "train_files") and not config.train_files:
            raise app.UsageError(f"--{name} applies to --train_files, which is not given")
    if flag_values.mix_temperature is not None and getattr(config, "train_weights", ()):
        raise app.UsageError("--mix_temperature sets the weights; the --train_files entries "
                             "have their own (GLOB@WEIGHT): give one")
    if flag_values.eval_percent is not None and getattr(config, "eval_files", ()):
        raise app.UsageError("--eval_percent has no effect with --eval_files (nothing is held out)")
    if flag_values.files and user:
        raise app.UsageError("--files (embedded-corpus format) and --train_files/--source_files "
                             "exclude each other")
    learned = getattr(config, "tokenizer", None) in ("wordpiece", "sentencepiece")
    for name in ("vocab_size", "vocab_max_lines"):
        if flag_values[name].value is not None and not learned:
            raise app.UsageError(f"--{name} applies to --tokenizer=wordpiece or sentencepiece, "
                                 f"not --tokenizer={getattr(config, 'tokenizer', 'whitespace')}")
    if flag_values.vocab and flag_values.vocab_size is not None:
        raise app.UsageError("--vocab loads a vocabulary; --vocab_size learns one: give one")


def changed_run_message(error) -> str:
    """The message of a resume whose settings differ: each change, then the ways out."""
    flagfile = os.path.join(error.model_dir, "flags.txt")
    task = next((c for c in error.changes if c.setting == "task"), None)
    if task is not None:  # another task's run: its other differences say nothing more
        return (f"{error.model_dir} holds a --task={task.saved} run, not --task={task.new}: "
                f"give this run its own --model_dir (--flagfile={flagfile} resumes that one)")
    lines = [f"{error.model_dir} holds a run started with other settings; this command "
             "changes:"]
    for change in error.changes:
        if change.setting == "input":
            lines.append(f"  input file {change.saved}: {change.new}")
            continue
        group, _, field = change.setting.partition(".")
        flag = {"global_budget": "--num_replicas x --" + field,
                "model": f"model {field}"}.get(group)
        if flag is None:
            flag = f"--{FLAG_OF_FIELD[field]}" if field in FLAG_OF_FIELD else f"setting {field}"
        if change.setting == "workers":
            flag = "the number of workers (TF_CONFIG)"
        lines.append(f"  {flag}: saved {change.saved!r}, now {change.new!r}")
    lines.append(f"Resume with the saved flags: --flagfile={flagfile} "
                 "(--num_replicas may change if --max_tokens keeps their product); or start a "
                 "new run with another --model_dir.")
    if any(c.setting == "input" for c in error.changes):
        vocab = [n for n in os.listdir(error.model_dir)
                 if n.startswith(("vocab.", "source_vocab"))]
        if vocab:
            lines.append("To train on the changed files with this run's vocabulary, start a new "
                         "run with --model_dir=NEW "
                         f"--vocab={os.path.join(error.model_dir, vocab[0])}")
    return "\n".join(lines)


def run_settings(flag_values, started: float):
    """The ``RunSettings`` of ``tfseq-train``'s run flags (``started``: the process' start)."""
    from tfseq.pipelines.runner import RunSettings

    f = flag_values
    return RunSettings(
        model_dir=f.model_dir, epochs=f.epochs, max_steps=f.max_steps,
        checkpoint_every=f.checkpoint_every, num_replicas=f.num_replicas,
        steps_per_execution=f.steps_per_execution, strategy=f.strategy,
        data_service=f.data_service, learning_rate=f.learning_rate, verbose=f.verbose,
        export=f.export, started=started)


def save_run_files(model_dir: str, argv, flag_values, names) -> None:
    """``flags.txt`` (the flags ``names``, the binary's own: a flagfile must parse before
    TensorFlow defines its own; paths absolute, so it works from any directory) and
    ``argv.json``."""
    import json

    os.makedirs(model_dir, exist_ok=True)
    serialized = []
    for name in names:
        flag = flag_values[name]
        if name in PATH_FLAGS and flag.present and flag.value:
            value = absolute(flag.value)
            serialized.append(f"--{name}={','.join(value) if isinstance(value, list) else value}")
        else:
            serialized.append(flag.serialize())
    with open(os.path.join(model_dir, "flags.txt"), "w") as f:
        f.write("\n".join(s for s in serialized if s) + "\n")
    with open(os.path.join(model_dir, "argv.json"), "w") as f:
        json.dump(list(argv), f)
