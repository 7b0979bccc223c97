"""tfseq: variable-length sequence input pipelines and models for TensorFlow."""

from setuptools import find_packages, setup

setup(
    name="tfseq",
    version="0.1.0",
    description="Fast, exactly-once tf.data pipelines and Keras models for variable-length sequences.",
    packages=find_packages(include=["tfseq", "tfseq.*", "pipelines", "pipelines.*", "models", "models.*"]),
    package_data={"tfseq": ["data/*.gz", "data/README.md"]},
    python_requires=">=3.10",
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "tensorflow-text>=2.21,<2.22",
        "numpy",
        "absl-py",
        "sentencepiece",  # SentencePiece vocabularies (training them; serving uses tensorflow-text)
    ],
    extras_require={
        "test": ["pytest", "hypothesis"],
        "profile": ["tensorboard-plugin-profile"],
        "plot": ["matplotlib"],
    },
)
