"""tfseq: variable-length sequence input pipelines and models for TensorFlow.

The repository keeps its layout (``tfseq/`` the library, ``pipelines/`` the tasks, ``models/``
their Keras models, ``scripts/`` the binaries); the wheel maps the last three into the ``tfseq``
namespace (``tfseq.pipelines``, ``tfseq.models``, ``tfseq.scripts``), so ``tfseq`` is its only
top-level package. In a checkout the editable install (``pip install -e .``, what ``make`` runs;
PEP 660, ``setuptools>=64`` per ``pyproject.toml``) maps them the same way.
"""

from setuptools import find_packages, setup

MAPPED = {f"tfseq.{name}": name for name in ("pipelines", "models", "scripts")}
COMMANDS = {"tfseq-train": "train", "tfseq-predict": "predict", "tfseq-export": "export",
            "tfseq-profile": "profile", "tfseq-data-service": "data_service"}

setup(
    name="tfseq",
    version="0.1.0",
    description="Fast, exactly-once tf.data pipelines and Keras models for variable-length sequences.",
    packages=find_packages(include=["tfseq", "tfseq.*"]) + sorted(MAPPED),
    package_dir=MAPPED,
    package_data={"tfseq": ["data/*.gz", "data/README.md"]},
    entry_points={"console_scripts": [f"{command}=tfseq.scripts.{module}:run"
                                      for command, module in COMMANDS.items()]},
    python_requires=">=3.10",
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "tensorflow-text>=2.21,<2.22",
        "numpy",
        "absl-py",
        "sentencepiece",  # SentencePiece vocabularies (training them; serving uses tensorflow-text)
        "tokenizers",  # Vocab.learn(tokenizer="wordpiece"): Hugging Face's Rust WordPiece trainer
    ],
    extras_require={
        "test": ["pytest", "hypothesis"],
        "profile": ["tensorboard-plugin-profile"],
        "plot": ["matplotlib"],
    },
)
