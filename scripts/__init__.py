"""The binaries (``tfseq-train``, ``tfseq-predict``, ``tfseq-export``, ``tfseq-profile``,
``tfseq-data-service``) and the benchmark scripts; installed as ``tfseq.scripts``."""
