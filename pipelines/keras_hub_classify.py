"""Text classification with a KerasHub model: ``--task=classify --keras_hub=PATH``.

The task of ``pipelines.classify`` (its rows, labels, drop reasons, prediction lines) with a
KerasHub ``TextClassifier`` (``BertTextClassifier``, ...) for the model and the KerasHub
tokenizer of ``PATH`` in place of tfseq's vocabulary. Everything else is the spine's: the
user's files, the shuffled resumable stream, bucketed batches under ``--max_tokens`` (little
padding instead of KerasHub's fixed ``sequence_length``), the report and the export.

``PATH`` is on local disk (nothing is downloaded; ``kaggle://``/``hf://`` handles are refused):

* a KerasHub preset directory, as ``save_to_preset`` writes it: ``config.json`` (the
  backbone), ``tokenizer.json`` and its assets (``assets/tokenizer/vocabulary.txt``), the
  weights (``model.weights.h5``; without them the backbone starts from random weights), and
  ``task.json`` when saved from a ``TextClassifier`` (its class and dropout are kept; its
  head is not, the labels being the run's);
* a backbone config file (``.json``), a model trained from scratch::

      {"class_name": "BertBackbone",                     # a keras_hub.models backbone
       "config": {"vocabulary_size": 30, "num_layers": 2, "num_heads": 2, "hidden_dim": 32,
                  "intermediate_dim": 64, "max_sequence_length": 64},
       "vocabulary": "vocab.txt",                        # optional (see below)
       "tokenizer": {"lowercase": true}}                 # optional tokenizer arguments

  ``class_name`` and ``config`` are what KerasHub writes in a preset's ``config.json`` (that
  file works as it is). The tokenizer is the class KerasHub pairs with the backbone
  (``BertTokenizer`` for ``BertBackbone``), made from ``vocabulary`` (default:
  ``vocabulary.txt`` or ``vocab.txt`` next to the file); ``merges`` (byte-pair tokenizers)
  and ``proto`` (SentencePiece) name files too; file names are relative to the JSON file.

The classifier is the preset's ``TextClassifier`` class for its backbone (``preprocessor=None``,
``num_classes`` the labels the run learns). Examples are ``[CLS] text [SEP]`` ids as the
model's preprocessor makes them, at most ``min(--max_length, max_sequence_length)`` ids
(``--long_examples``: cut keeping the end token, or dropped). The run's state
(``KerasHubState``) is its labels and the model's parts, written to ``<model_dir>/keras_hub``
(a KerasHub preset: backbone config and starting weights, tokenizer, vocabulary) before the
first step; a resume and the export read them from there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import tensorflow as tf

from tfseq import serving
from tfseq.batching import mode_of
from tfseq.errors import InputError
from tfseq.keras_hub import Encoder, keras_hub_module, special_ids, token_ids
from tfseq.pipelines import classify
from tfseq.pipelines.spine import limit_lengths
from tfseq.pipelines.state import TaskState

PRESET_DIR = "keras_hub"         # the run's copy of the model's parts, in model_dir
RUN_INFO = "tfseq.json"          # in that copy: where it came from, what it holds
CONFIG_FILE, TOKENIZER_FILE, TASK_FILE = "config.json", "tokenizer.json", "task.json"
WEIGHTS_FILES = ("model.weights.h5", "model.weights.json")  # one file, or sharded
VOCABULARY_FILES = ("vocabulary.txt", "vocab.txt")
TOKENIZER_FILE_ARGS = ("vocabulary", "merges", "proto")   # file names in a config file
CONFIG_KEYS = {"class_name", "config", "module", "registered_name", "build_config",
               "compile_config", "vocabulary", "tokenizer"}
KEPT_TASK_ARGS = ("dropout",)    # of a preset's task.json (not its head, not its activation)


@dataclasses.dataclass(frozen=True)
class Config(classify.Config):
    """``classify.Config`` with the KerasHub model to train (``--keras_hub``)."""

    keras_hub: str | None = None           # a preset directory or a backbone config .json

    def check(self) -> None:
        super().check()
        if not self.keras_hub:
            raise InputError("--task=keras_hub_classify needs --keras_hub=PATH (a KerasHub "
                             "preset directory or a backbone config .json)")
        if "://" in self.keras_hub:
            raise InputError(f"--keras_hub={self.keras_hub} is a download handle; tfseq-train "
                             "reads a model from local disk and downloads nothing: save it "
                             "once (e.g. keras_hub.models.BertTextClassifier.from_preset("
                             "HANDLE).save_to_preset(DIR)) and give --keras_hub=DIR")
        if mode_of(self.batching).packs:
            raise InputError(f"--batching={self.batching} puts several texts in a row, and a "
                             "KerasHub backbone takes a padding mask only (they would attend "
                             "to each other): drop --batching (bucketed batches) or use pad")
        try:
            keras_hub_module()
        except ImportError as e:
            raise InputError(f"--keras_hub: {e}") from None


def _fail(path: str, what: str):
    raise InputError(f"--keras_hub={path}: {what}")


def _read_json(path: str, where: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        _fail(where, f"cannot read {os.path.basename(path)} ({e})")
    if not isinstance(value, dict):
        _fail(where, f"{os.path.basename(path)} is not a JSON object")
    return value


class HubModel:
    """A KerasHub text classifier's parts on local disk (see the module docstring): a preset
    directory or a backbone config file, read when opened (``open`` checks it in one line per
    problem); the backbone and the classifier are built on demand, the tokenizer once.

    Attributes:
      path: the directory or file.
      backbone_config: the backbone's serialized config (``{"class_name", "config"}``).
      classifier_class: the ``TextClassifier`` subclass; ``classifier_args`` its kept
        arguments (a preset's dropout).
      weights: a preset whose backbone weights are loaded; ``pretrained``: weights the run
        started from (not a random start saved by a run).
      max_sequence_length: the longest input the backbone takes (``None``: no limit).
    """

    def __init__(self, path: str):
        self.path = path
        self._tokenizer = None
        try:
            self.keras_hub = keras_hub_module()
        except ImportError as e:
            raise InputError(f"--keras_hub: {e}") from None
        if os.path.isdir(path):
            self._read_preset(path)
        else:
            self._read_config_file(path)
        self.max_sequence_length = self.backbone_config["config"].get("max_sequence_length")

    @classmethod
    def open(cls, path: str) -> "HubModel":
        """The model at ``path``, with its tokenizer checked against its backbone.

        Raises:
          InputError: a path that is not there, not a preset or config file, a backbone
            that is not a KerasHub text backbone, a missing tokenizer or vocabulary, or a
            vocabulary larger than the backbone's (each in one line naming the file).
        """
        if not os.path.exists(path):
            _fail(path, "no such file or directory (a KerasHub preset directory or a backbone "
                        "config .json; a preset name such as bert_base_en is a download: "
                        "save it with save_to_preset first)")
        hub = cls(path)
        size = hub.backbone_config["config"].get("vocabulary_size")
        tokens = hub.tokenizer().vocabulary_size()
        if size is not None and tokens > size:
            _fail(path, f"the tokenizer has {tokens:,} tokens but the backbone's "
                        f"vocabulary_size is {size:,}: give a vocabulary of the backbone's "
                        "size, or raise its vocabulary_size")
        return hub

    # ----- reading

    def _backbone_class(self, name, where):
        keras_hub = self.keras_hub
        cls = getattr(keras_hub.models, str(name), None)
        if not (isinstance(cls, type) and issubclass(cls, keras_hub.models.Backbone)):
            _fail(where, f"class_name {name!r} is not a keras_hub.models backbone (e.g. "
                         "BertBackbone)")
        found = sorted({c for c in vars(keras_hub.models).values()
                        if isinstance(c, type) and issubclass(c, keras_hub.models.TextClassifier)
                        and getattr(c, "backbone_cls", None) is cls}, key=lambda c: c.__name__)
        if not found:
            _fail(where, f"KerasHub has no text classifier for {name} (text backbones: "
                         f"{', '.join(_text_backbones(keras_hub))})")
        return cls, found[0]

    def _read_preset(self, path):
        config_path = os.path.join(path, CONFIG_FILE)
        if not os.path.exists(config_path):
            _fail(path, f"no {CONFIG_FILE}: not a KerasHub preset directory (save_to_preset "
                        "writes one)")
        config = _read_json(config_path, path)
        if "class_name" not in config or "config" not in config:
            _fail(path, f"{CONFIG_FILE} is not a KerasHub backbone config (no class_name and "
                        "config): save the model with KerasHub's save_to_preset")
        if not os.path.exists(os.path.join(path, TOKENIZER_FILE)):
            _fail(path, f"no {TOKENIZER_FILE}: save the preset with its tokenizer (a task "
                        "with its preprocessor, or tokenizer.save_to_preset(DIR))")
        self.backbone_config = config
        self.backbone_class, self.classifier_class = self._backbone_class(
            config["class_name"], path)
        self.preset = True
        self.weights = any(os.path.exists(os.path.join(path, f)) for f in WEIGHTS_FILES)
        self.pretrained = self.weights
        self.classifier_args = {}
        info_path = os.path.join(path, RUN_INFO)
        task_path = os.path.join(path, TASK_FILE)
        if os.path.exists(info_path):  # a run's copy: what it was made from
            info = _read_json(info_path, path)
            self.pretrained = bool(info["pretrained"])
            self.classifier_class = getattr(self.keras_hub.models, info["classifier"])
            self.classifier_args = dict(info["classifier_args"])
        elif os.path.exists(task_path):
            task = _read_json(task_path, path)
            cls = getattr(self.keras_hub.models, str(task.get("class_name")), None)
            if isinstance(cls, type) and issubclass(cls, self.classifier_class):
                self.classifier_class = cls
            self.classifier_args = {k: task["config"][k] for k in KEPT_TASK_ARGS
                                    if k in task.get("config", {})}

    def _read_config_file(self, path):
        config = _read_json(path, path)
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown or "class_name" not in config or not isinstance(config.get("config"), dict):
            _fail(path, "a backbone config file has class_name (e.g. BertBackbone), config (its "
                        "arguments) and optionally vocabulary and tokenizer"
                  + (f"; unknown keys {unknown}" if unknown else ""))
        self.backbone_config = {"class_name": config["class_name"], "config": config["config"]}
        self.backbone_class, self.classifier_class = self._backbone_class(
            config["class_name"], path)
        self.preset = self.weights = self.pretrained = False
        self.classifier_args = {}
        args = dict(config.get("tokenizer") or {})
        if "vocabulary" in config:
            args["vocabulary"] = config["vocabulary"]
        folder = os.path.dirname(os.path.abspath(path))
        if not any(k in args for k in ("vocabulary", "proto")):
            found = [name for name in VOCABULARY_FILES
                     + (os.path.join("assets", "tokenizer", "vocabulary.txt"),)
                     if os.path.exists(os.path.join(folder, name))]
            if not found:
                _fail(path, f"no vocabulary: name it (\"vocabulary\": \"FILE\") or put "
                            f"{' or '.join(VOCABULARY_FILES)} next to it")
            args["vocabulary"] = found[0]
        for key in TOKENIZER_FILE_ARGS:
            if key in args:
                args[key] = os.path.join(folder, str(args[key]))
                if not os.path.exists(args[key]):
                    _fail(path, f"its {key} file {args[key]} does not exist")
        self.tokenizer_args = args

    # ----- the parts

    def tokenizer(self):
        """The KerasHub tokenizer (made once, eagerly: its tables outlive any graph that
        asks for it first)."""
        if self._tokenizer is None:
            try:
                with tf.init_scope():
                    if self.preset:
                        self._tokenizer = self.keras_hub.tokenizers.Tokenizer.from_preset(
                            self.path)
                    else:
                        cls = self.classifier_class.preprocessor_cls.tokenizer_cls
                        self._tokenizer = cls(**self.tokenizer_args)
            except (TypeError, ValueError, OSError) as e:
                _fail(self.path, f"its tokenizer cannot be made: {_first_line(e)}")
        return self._tokenizer

    def backbone(self):
        """A new backbone: the preset's (with its weights) or one made from the config."""
        try:
            if self.preset:
                return self.keras_hub.models.Backbone.from_preset(self.path,
                                                                  load_weights=self.weights)
            return self.backbone_class.from_config(dict(self.backbone_config["config"]))
        except (TypeError, ValueError, OSError) as e:
            _fail(self.path, f"{self.backbone_config['class_name']} cannot be made from its "
                             f"config: {_first_line(e)}")

    def classifier(self, num_classes: int):
        """A new ``TextClassifier`` on a new backbone, ``num_classes`` logits, no
        preprocessor."""
        return self.classifier_class(backbone=self.backbone(), num_classes=num_classes,
                                     preprocessor=None, **self.classifier_args)

    def sequence_length(self, max_length: int) -> int:
        """Ids per example, start and end included: ``max_length``, at most what the backbone
        takes."""
        return min(max_length, self.max_sequence_length or max_length)

    def describe(self) -> dict:
        """What the export's ``serving.json`` says of the model."""
        return {"backbone": self.backbone_config["class_name"],
                "classifier": self.classifier_class.__name__,
                "tokenizer": type(self.tokenizer()).__name__,
                "pretrained": self.pretrained}

    def save(self, directory: str) -> "HubModel":
        """Writes the parts as a KerasHub preset in ``directory`` (backbone config and weights,
        tokenizer and vocabulary, and ``tfseq.json``: the source, the classifier class); returns
        the model read from there."""
        staging = directory.rstrip("/") + ".tmp"
        shutil.rmtree(staging, ignore_errors=True)
        self.backbone().save_to_preset(staging)
        self.tokenizer().save_to_preset(staging)
        with open(os.path.join(staging, RUN_INFO), "w", encoding="utf-8") as f:
            json.dump({"source": os.path.abspath(self.path), "pretrained": self.pretrained,
                       "classifier": self.classifier_class.__name__,
                       "classifier_args": self.classifier_args}, f, indent=2, sort_keys=True)
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)
        return HubModel(directory)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _text_backbones(keras_hub) -> list[str]:
    return sorted({c.backbone_cls.__name__ for c in vars(keras_hub.models).values()
                   if isinstance(c, type) and issubclass(c, keras_hub.models.TextClassifier)
                   and getattr(c, "backbone_cls", None) is not None})


@dataclasses.dataclass
class KerasHubState(TaskState):
    """A run's labels and its KerasHub model (``hub``): saved as ``labels.txt`` and
    ``<model_dir>/keras_hub`` (a KerasHub preset), from where a resume and the export read
    it."""

    hub: HubModel | None = None

    def save(self, directory: str) -> list[str]:
        names = super().save(directory)
        target = os.path.join(directory, PRESET_DIR)
        if os.path.abspath(self.hub.path) != os.path.abspath(target):
            self.hub = self.hub.save(target)  # from now on the run's own copy
        return names + [PRESET_DIR]

    @classmethod
    def load(cls, directory: str, vocab_names, label_columns) -> "KerasHubState":
        """Reads what ``save`` wrote.

        Raises:
          FileNotFoundError: ``labels.txt`` or ``keras_hub/`` is missing (naming it).
        """
        state = TaskState.load(directory, vocab_names, label_columns)
        path = os.path.join(directory, PRESET_DIR)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"No {path}: not a run of --keras_hub")
        return cls(state.vocabs, state.labels, hub=HubModel(path))


class KerasHubClassify(classify.Classify):
    """``classify`` with a KerasHub ``TextClassifier`` and its tokenizer."""

    name = "keras_hub_classify"
    Config = Config
    vocab_columns = {}  # the model's own vocabulary: nothing learned
    model_module = "tfseq.models.keras_hub_classifier"
    modes = ("single", "replicated")
    refused = {field: "does not apply with --keras_hub: the KerasHub model's own tokenizer and "
                      "vocabulary encode the text"
               for field in ("tokenizer", "vocab_path", "vocab_size", "vocab_max_lines")}

    def prepare(self, config, *, shards=None, fingerprint=None, write=None):
        """The labels (one read of the training records) and the model of ``--keras_hub``,
        checked before the read."""
        config.check()
        hub = HubModel.open(config.keras_hub)
        state, report = super().prepare(config, shards=shards, fingerprint=fingerprint,
                                        write=write)
        return KerasHubState(state.vocabs, state.labels, hub=hub), report

    def saved_state(self, model_dir, config):
        return KerasHubState.load(model_dir, list(self.vocab_columns), list(self.label_columns))

    def encode_rows(self, config, state, rows, counter):
        """``[CLS] text [SEP]`` ids (``tfseq.keras_hub.token_ids``), at most
        ``sequence_length`` of them; ``--long_examples`` as for every task."""
        hub = state.hub
        limit = hub.sequence_length(config.max_length)
        start, end, tokenizer = special_ids(hub.tokenizer())
        ids, cut = token_ids(tokenizer, rows["text"], start=start, end=end,
                             sequence_length=limit)
        return limit_lengths(config, counter, {"ids": ids, "label": rows["label"]},
                             {"ids": limit}, min_length={"ids": 1}, over=cut)

    def serving_module(self, config, state, model, asset_dir):
        labels = list(state.labels["label"])
        limit = state.hub.sequence_length(config.max_length)
        encoder = Encoder(state.hub.tokenizer(), sequence_length=limit)
        module = classify.ServedClassifier(serving.keras_model_fn(model), encoder, labels,
                                           asset_dir, config.long_examples)
        return module, {"input": "text", "outputs": ["label", "probabilities"],
                        "num_labels": len(labels), "max_ids": limit}

    def export_module(self, config, state, model, asset_dir):
        """The classifier's export, its tokenization being the KerasHub model's."""
        module, meta = super().export_module(config, state, model, asset_dir)
        meta.pop("lowercase", None)
        meta.update(tokenizer=type(state.hub.tokenizer()).__name__,
                    max_length=state.hub.sequence_length(config.max_length),
                    keras_hub=state.hub.describe())
        return module, meta


TASK = KerasHubClassify()
