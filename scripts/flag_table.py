"""Every flag of the commands, defined once, and what a task's ``Config`` takes from them.

``tfseq-train`` defines all of ``FLAGS_TABLE``; ``tfseq-profile`` and ``tfseq-predict`` define
the input flags they share with it (files, format, columns, header, batching, budgets,
lengths) from the same rows, so a value one command accepts the others accept too.
``build_config(task, flag_values)`` applies the flags given to the task's ``Config``, refusing
flags the task does not use or that conflict (``app.UsageError``, one line naming the flag);
``run_settings`` takes the run flags; ``changed_run_message`` words a ``runs.ChangedRun`` in
flag names.
"""

from __future__ import annotations

import dataclasses
import json
import os

from absl import app, flags

from tfseq import batching
from tfseq.errors import InputError
from tfseq.formats import FORMATS
from tfseq.pipelines import mixture, tasks
from tfseq.pipelines.runner import RunSettings


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag: its absl kind, default and help, and the task ``Config`` field it sets."""

    kind: str                     # string | list | int_list | enum | integer | float | boolean
    help: str
    default: object = None
    choices: tuple = ()
    field: str | None = None      # the Config field it sets (None: a run or command setting)
    lower_bound: int | None = None


def _positive_ints(name: str, example: str):
    return (lambda v: v is None or all(s.isdigit() and int(s) > 0 for s in v),
            f"--{name} takes positive ints{example}")


FLAGS_TABLE: dict[str, Flag] = {
    # ----- the task and the input
    "task": Flag("enum", "Which task.", "classify", tuple(tasks.TASKS)),
    "keras_hub": Flag("string", "classify: train a KerasHub text classifier from local disk "
                      "instead of tfseq's model: a preset directory (what save_to_preset "
                      "writes: config.json, tokenizer.json, weights) or a backbone config "
                      ".json with its vocabulary (docs/keras_hub.md). Its tokenizer replaces "
                      "--tokenizer/--vocab; nothing is downloaded (the same as "
                      "--task=keras_hub_classify).", field="keras_hub"),
    "files": Flag("list", "Files in the embedded corpus' layout (book, chapter, verse, text; "
                  "default: the embedded corpus).", [], field="files"),
    "train_files": Flag("list", "Your training files: comma-separated globs, .gz allowed. "
                        "Several corpora at set proportions: GLOB@WEIGHT entries, e.g. "
                        "'news/*.tsv@0.7,web/*.tsv.gz@0.3' (each entry a source, mixed "
                        "exactly).", [], field="train_files"),
    "sources": Flag("string", "A JSON file of training sources, each with its own files, "
                    "weight, format, columns and header (docs/sources.md): the general form of "
                    "--train_files='a.jsonl@0.7,b.tsv@0.3'."),
    "mix_temperature": Flag("float", "Each --train_files entry a source, weighted by its "
                            "records ** (1/T): 1 in proportion to size, higher evens them out.",
                            field="mix_temperature"),
    "eval_files": Flag("list", "Your eval files (default: hold out --eval_percent).", [],
                       field="eval_files"),
    "format": Flag("enum", "File format (default: from the extension).", None, FORMATS,
                   field="format"),
    "columns": Flag("list", "Field names in order, e.g. label,text ('_' skips a field; JSON "
                    "keys, TFRecord features and Parquet columns by name; FIELD=KEY reads the "
                    "file's KEY as the column FIELD, e.g. label=category,text=meta.body).", [],
                    field="columns"),
    "header": Flag("boolean", "Skip the first line of every file.", False, field="header"),
    "eval_percent": Flag("integer", "Percent of training lines held out (hashed); 0 and no "
                         "--eval_files: no evaluation.",
                         field="eval_percent"),
    "source_files": Flag("list", "translate: source side, plain text line-aligned.", [],
                         field="source_files"),
    "target_files": Flag("list", "translate: target side, plain text line-aligned.", [],
                         field="target_files"),
    # ----- tokens
    "tokenizer": Flag("enum", "Tokenizer (task default: whitespace).", None,
                      ("whitespace", "unicode_script", "wordpiece", "sentencepiece"),
                      field="tokenizer"),
    "vocab_size": Flag("integer", "Learn a wordpiece/sentencepiece vocab of this size.",
                       field="vocab_size"),
    "vocab_max_lines": Flag("integer", "Lines sampled (uniformly over the training files) to "
                            "learn a vocabulary (default 1M).", field="vocab_max_lines"),
    "vocab": Flag("string", "Vocabulary file (or SentencePiece .model) to load.",
                  field="vocab_path"),
    "long_examples": Flag("enum", "Examples over --max_length: truncate (counted) or drop "
                          "(counted).", None, ("truncate", "drop"), field="long_examples"),
    # ----- batching (what each mode takes: tfseq.batching.MODES)
    "batching": Flag("enum", "Batching mode (task default): " + "; ".join(
        f"{name}: {mode.description}" for name, mode in batching.MODES.items()) + ".", None,
        tuple(batching.MODES), field="batching"),
    "batch_size": Flag("integer", "Examples per batch per replica for --batching=pad.",
                       field="batch_size"),
    "max_tokens": Flag("integer", "Token budget per batch per replica (rows x padded length) "
                       "for --batching=bucket or pack.", field="max_tokens"),
    "max_length": Flag("integer", "Tokens per example (see --long_examples).",
                       field="max_length"),
    "block_length": Flag("int_list", "Row length for --batching=pack, or several (e.g. "
                         "32,64,128): each example goes into the shortest rows that hold it, "
                         "and each batch has rows of one length (task default: 32,64,128; "
                         "translate: 64).", field="block_length"),
    "boundaries": Flag("int_list", "Bucket upper lengths for --batching=bucket, e.g. "
                       "16,32,64 (default: every length its own bucket).", field="boundaries"),
    "tbptt": Flag("integer", "Truncated-BPTT chunk length (task lm; the same as "
                  "--task=lm_tbptt).", field="tbptt"),
    "jit_compile": Flag("boolean", "Compile each training step with XLA, one program per "
                        "batch shape; training batches are padded and filled to a few shapes "
                        "(the report's `jit` says how many). One replica, no --data_service.",
                        False, field="jit_compile"),
    "seed": Flag("integer", "Seed for shuffling and the model's initial weights.", 0,
                 field="seed"),
    "shuffle_shard_bytes": Flag("integer", "Text per shard of the line shuffle (default 64 "
                                "MiB): its memory bound; larger inputs are spilled into "
                                "<model_dir>/data/ in shards of this size.",
                                field="shuffle_shard_bytes"),
    # ----- the run
    "model_dir": Flag("string", "Checkpoints, logs, flags and the report.", "runs/default"),
    "learning_rate": Flag("float", "Adam learning rate (default: the model's, 0.003). A bucket "
                          "or pack step carries several times the tokens of a padded one: "
                          "scale the rate by the square root of that ratio "
                          "(docs/benchmarks.md)."),
    "epochs": Flag("integer", "Epochs to train.", 2),
    "max_steps": Flag("integer", "Stop after this many steps in this run (resumable)."),
    "checkpoint_every": Flag("integer", "Checkpoint every N steps (0: epoch ends only).", 200),
    "mixed_precision": Flag("boolean", "Train with the mixed_float16 policy.", False),
    "steps_per_execution": Flag("integer", "Training steps per Python call: the batches are "
                                "taken, trained on and counted inside one graph (progress, "
                                "checkpoints and signals between calls). One replica, no "
                                "--data_service; TensorBoard then has no per-batch row "
                                "lengths.", 1, lower_bound=1),
    "num_replicas": Flag("integer", "Replicas (GPUs, or logical CPUs without a GPU).", 1),
    "strategy": Flag("enum", "mirrored: --num_replicas on this machine. multi_worker: "
                     "MultiWorkerMirroredStrategy over the workers in TF_CONFIG (one process "
                     "per worker; the chief, index 0, writes checkpoints, logs and the "
                     "report).", "mirrored", ("mirrored", "multi_worker")),
    "data_service": Flag("string", "tf.data service address, e.g. grpc://localhost:5000."),
    "verbose": Flag("integer", "0: only the report; 1: also progress lines and bars; 2: also "
                    "INFO logs and TensorFlow's own.", 1),
    "export": Flag("boolean", "When the run finishes or stops at --max_steps, write "
                   "<model_dir>/export (a SavedModel over raw text; see tfseq-export).", True),
}
VALIDATORS = {"block_length": _positive_ints("block_length", ": one (128) or several (32,64,128)"),
              "boundaries": _positive_ints("boundaries", ", e.g. 16,32,64"),
              "learning_rate": (lambda v: v is None or v > 0, "--learning_rate must be > 0")}
# The input flags every command that reads a task's files shares.
INPUT_FLAGS = ("task", "files", "train_files", "sources", "format", "columns", "header",
               "batching", "batch_size", "max_tokens", "max_length", "block_length",
               "boundaries")
CONFIG_FLAGS = {name: flag.field for name, flag in FLAGS_TABLE.items() if flag.field}
FLAG_OF_FIELD = {field: name for name, field in CONFIG_FLAGS.items()}
FLAG_OF_FIELD["train_weights"] = "train_files weights"
FLAG_OF_FIELD.update(source_formats="sources (their formats)",
                     source_columns="sources (their columns)",
                     source_headers="sources (their headers)")
PATH_FLAGS = ("files", "train_files", "eval_files", "source_files", "target_files", "vocab",
              "keras_hub", "model_dir")
# A flag that makes a task another one: --task=lm --tbptt=N is lm_tbptt, --task=classify
# --keras_hub=PATH is keras_hub_classify.
DERIVED_TASKS = {("lm", "tbptt"): "lm_tbptt", ("classify", "keras_hub"): "keras_hub_classify"}


def define(names, *, defaults: dict | None = None, helps: dict | None = None,
           required=(), flag_values=flags.FLAGS) -> list[str]:
    """Defines the flags ``names`` of ``FLAGS_TABLE`` (``defaults``/``helps`` override a
    command's own; ``required``: flags the command cannot run without); returns their
    names."""
    defaults, helps = defaults or {}, helps or {}
    for name in names:
        flag = FLAGS_TABLE[name]
        default = defaults.get(name, flag.default)
        text = helps.get(name, flag.help)
        if flag.kind == "enum":
            flags.DEFINE_enum(name, default, list(flag.choices), text, flag_values=flag_values)
        elif flag.kind in ("list", "int_list"):
            flags.DEFINE_list(name, default, text, flag_values=flag_values)
        elif flag.kind == "integer":
            flags.DEFINE_integer(name, default, text, lower_bound=flag.lower_bound,
                                 flag_values=flag_values)
        else:
            {"string": flags.DEFINE_string, "float": flags.DEFINE_float,
             "boolean": flags.DEFINE_boolean}[flag.kind](name, default, text,
                                                         flag_values=flag_values)
        if name in VALIDATORS:
            flags.register_validator(name, *VALIDATORS[name], flag_values=flag_values)
        if name in required:
            flags.mark_flag_as_required(name, flag_values=flag_values)
    return list(names)


def task_name(flag_values) -> str:
    """The ``--task``, or the task a flag makes of it (``DERIVED_TASKS``): ``--task=lm
    --tbptt=N`` is ``lm_tbptt`` (the same task as ``--task=lm_tbptt --tbptt=N``)."""
    for (task, flag), derived in DERIVED_TASKS.items():
        if flag_values.task == task and flag in flag_values and flag_values[flag].present:
            return derived
    return flag_values.task


def absolute(value):
    """A path (or a tuple or list of paths or globs) made absolute; ``None`` and URLs
    (``gs://...``, ``kaggle://...``) stay."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return type(value)(absolute(v) for v in value)
    return value if "://" in value else os.path.abspath(value)


def given(flag_values, name: str) -> bool:
    """Whether ``--name`` was given with a value other than its default (a flagfile repeats
    the defaults)."""
    if name not in flag_values:
        return False
    flag = flag_values[name]
    return flag.present and flag.value != flag.default


def run_settings(flag_values, started: float) -> RunSettings:
    """The ``RunSettings`` of the run flags (``started``: the process' start)."""
    f = flag_values
    return RunSettings(
        model_dir=f.model_dir, epochs=f.epochs, max_steps=f.max_steps,
        checkpoint_every=f.checkpoint_every, num_replicas=f.num_replicas,
        steps_per_execution=f.steps_per_execution, strategy=f.strategy,
        data_service=f.data_service, learning_rate=f.learning_rate, verbose=f.verbose,
        export=f.export, started=started)


def build_config(task, flag_values):
    """The task's Config with every explicitly given flag applied.

    Raises:
      app.UsageError: a flag the task does not use, or flags that conflict.
    """
    fields = {f.name for f in dataclasses.fields(task.Config)}
    values = {}
    for flag_name, field in CONFIG_FLAGS.items():
        if not given(flag_values, flag_name):
            continue
        if field in task.refused:
            raise app.UsageError(f"--{flag_name} {task.refused[field]}")
        if field not in fields:
            raise app.UsageError(f"--{flag_name} is not used by --task={task.name} "
                                 f"(its options: {sorted(fields - set(task.refused))})")
        value = flag_values[flag_name].value
        kind = FLAGS_TABLE[flag_name].kind
        if kind == "list":
            value = tuple(value)
        if kind == "int_list":
            value = tuple(sorted({int(v) for v in value}))
            if flag_name == "block_length" and len(value) == 1:
                value = value[0]
        if flag_name in ("train_files", "source_files"):  # GLOB@WEIGHT: a mixture
            value, weights = _split_weights(value, f"--{flag_name}")
            if weights and "train_weights" not in fields:
                raise app.UsageError(f"--task={task.name} trains on one source: "
                                     "--train_files entries take no @WEIGHT")
            if weights:
                values["train_weights"] = weights
        if flag_name in PATH_FLAGS:  # the run's files whatever the directory it runs from
            value = absolute(value)
        values[field] = value
    if given(flag_values, "sources"):
        if given(flag_values, "train_files") or given(flag_values, "mix_temperature"):
            raise app.UsageError("--sources lists the training files, weights and temperature: "
                                 "leave out --train_files and --mix_temperature")
        try:
            from_file = mixture.read_sources_file(flag_values.sources)
        except InputError as e:
            raise app.UsageError(str(e)) from None
        unknown = sorted(set(from_file) - fields)
        if unknown:
            raise app.UsageError(f"--sources is not used by --task={task.name} "
                                 "(it reads no --train_files)")
        values.update(from_file)
    config = dataclasses.replace(task.Config(), **values)
    if "batching" in fields:
        mode = batching.mode_of(config.batching)
        for name in batching.MODE_FLAGS:
            if given(flag_values, name) and name not in mode.flags:
                raise app.UsageError(batching.flag_refused(name, config.batching))
    if given(flag_values, "max_tokens") and flag_values.max_tokens <= 0:
        raise app.UsageError(f"--max_tokens must be a positive number of tokens per batch; "
                             f"received {flag_values.max_tokens}")
    check_no_effect(config, flag_values)
    return config


def _split_weights(entries, flag):
    try:
        return mixture.split_weights(entries, flag)
    except InputError as e:
        raise app.UsageError(str(e)) from None


def check_no_effect(config, flag_values) -> None:
    """A flag that would be silently ignored with the other flags given is an error naming it."""
    user = bool(getattr(config, "train_files", ())) or bool(getattr(config, "source_files", ()))
    for name in ("eval_files", "format", "columns", "header"):
        # (ctr has eval_files of its own, next to --files, and no train_files)
        if given(flag_values, name) and hasattr(config, "train_files") and not config.train_files:
            hint = (f"; e.g. --train_files={','.join(flag_values.files)}"
                    if given(flag_values, "files") else "")
            raise app.UsageError(f"--{name} applies to --train_files, which is not given{hint}")
    if given(flag_values, "mix_temperature") and getattr(config, "train_weights", ()):
        raise app.UsageError("--mix_temperature sets the weights; the --train_files entries "
                             "have their own (GLOB@WEIGHT): give one")
    if given(flag_values, "eval_percent") and getattr(config, "eval_files", ()):
        raise app.UsageError("--eval_percent has no effect with --eval_files (nothing is held out)")
    if given(flag_values, "files") and user:
        raise app.UsageError("--files (embedded-corpus format) and --train_files/--source_files "
                             "exclude each other")
    learned = getattr(config, "tokenizer", None) in ("wordpiece", "sentencepiece")
    for name in ("vocab_size", "vocab_max_lines"):
        if given(flag_values, name) and not learned:
            raise app.UsageError(f"--{name} applies to --tokenizer=wordpiece or sentencepiece, "
                                 f"not --tokenizer={getattr(config, 'tokenizer', 'whitespace')}")
    if given(flag_values, "vocab") and given(flag_values, "vocab_size"):
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


def save_run_files(model_dir: str, argv, flag_values, names) -> None:
    """``flags.txt`` (the flags ``names``, the binary's own: a flagfile must parse before
    TensorFlow defines its own; paths absolute, so it works from any directory) and
    ``argv.json``."""
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
