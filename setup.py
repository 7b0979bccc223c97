"""tfseq: variable-length sequence input pipelines and models for TensorFlow.

The repository keeps its layout (``tfseq/`` the library, ``pipelines/`` the tasks, ``models/``
their Keras models, ``scripts/`` the five commands); the wheel maps the last three into the
``tfseq`` namespace (``tfseq.pipelines``, ``tfseq.models``, ``tfseq.scripts``), so ``tfseq`` is
its only top-level package; ``benchmarks/`` and ``tools/`` stay out of it. In a checkout the
editable install (``pip install -e .``, what ``make`` runs; PEP 660, ``setuptools>=64`` per
``pyproject.toml``) maps them the same way.
"""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "tfseq", "__init__.py"), encoding="utf-8") as f:
    VERSION = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)
with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
    README = f.read()

MAPPED = {f"tfseq.{name}": name for name in ("pipelines", "models", "scripts")}
COMMANDS = {"tfseq-train": "train", "tfseq-predict": "predict", "tfseq-export": "export",
            "tfseq-profile": "profile", "tfseq-data-service": "data_service"}

setup(
    name="tfseq",
    version=VERSION,
    description="Fast, exactly-once tf.data pipelines and Keras models for variable-length sequences.",
    long_description=README,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    classifiers=["Programming Language :: Python :: 3",
                 "Topic :: Scientific/Engineering :: Artificial Intelligence"],
    packages=find_packages(include=["tfseq", "tfseq.*"]) + sorted(MAPPED),
    package_dir=MAPPED,
    package_data={"tfseq": ["data/*.gz", "data/README.md"]},
    entry_points={"console_scripts": [f"{command}=tfseq.scripts:launch_{module}"
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
        # xdist: `make test` on every core; keras-hub, pyarrow: their tests
        "test": ["pytest", "hypothesis", "pytest-xdist", "keras-hub", "pyarrow"],
        "keras-hub": ["keras-hub"],  # tfseq.keras_hub: KerasHub models fed by tfseq batches
        "parquet": ["pyarrow"],  # --format=parquet
        "profile": ["tensorboard-plugin-profile"],
        "plot": ["matplotlib"],
    },
)
