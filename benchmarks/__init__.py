"""tfseq's benchmarks: not part of the package (the wheel ships none of them).

Each runs from the repository root as ``python -m benchmarks.<name> [--flags]
--json_out=bench_out/<name>.json`` (``make bench`` runs them in turn), prints its schemes side
by side as ratios and writes its numbers as JSON. They share ``benchmarks.harness``: the common
flags, the corpus files, in-graph timing with the steady rate, tables and the JSON.
"""
