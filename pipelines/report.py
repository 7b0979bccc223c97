"""``report.json`` and the report printed at the end of a run: one schema in every mode.

``make_report`` builds the dict (single, replicated, multi_worker, data_service runs, every
task), ``format_report`` the console text, ``write_report`` writes it atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os

from tfseq.pipelines.mixture import format_sources


def make_report(*, task_name, config, mode, replicas, workers, learning_rate, result, stats,
                counters, eval_results, baselines, setup, data_state_bytes,
                drop_examples, data_service=None, first_step_seconds=None,
                timings=None, resumed_at_step=None, sources=None, jit=None) -> dict:
    """``report.json``: the same keys and shapes in every mode (single, replicated,
    multi_worker, data_service)."""
    seconds = result.train_seconds
    real = int(stats.real_tokens.numpy())
    return {
        "task": task_name, "config": dataclasses.asdict(config), "mode": mode,
        "replicas": replicas, "workers": workers, "data_service": data_service,
        "learning_rate": learning_rate, "steps": result.steps_done,
        "steps_this_command": result.steps_done - (resumed_at_step or 0),
        "epochs": result.epochs_done, "interrupted": result.interrupted,
        "train_seconds": seconds, "history": result.history,
        "real_tokens": real, "real_tokens_per_second": real / seconds if seconds else 0.0,
        "examples_trained": int(stats.examples.numpy()),
        "padding_efficiency": stats.padding_efficiency(),
        "eval": eval_results, "baselines": baselines,
        "counters": {k: {"seen": c.seen(), "drops": c.drops()} for k, c in counters.items()},
        "drop_examples": drop_examples,
        "setup": {"passes": setup.passes, "records": setup.records, "seconds": setup.seconds,
                  "first_step_seconds": first_step_seconds},
        "data_state_bytes": data_state_bytes,
        "resumed_at_step": resumed_at_step,
        "checkpoints": checkpoint_timings(timings),
        "sources": sources or [],
        # --jit_compile: the most batch shapes an epoch can have, and the programs compiled
        "jit": jit,
    }


def checkpoint_timings(timings) -> dict:
    """The trainer's checkpoint timings for the report (the same keys in every mode)."""
    timings = timings or {"save": [], "restore": None, "first_batch": None}
    saves = timings["save"]
    return {"saved": len(saves), "save_seconds": sum(saves) / len(saves) if saves else None,
            "restore_seconds": timings["restore"],
            "first_batch_after_restore_seconds": timings["first_batch"]}


def noop_report(report: dict) -> dict:
    """A finished run's saved ``report`` as a command that trained nothing shows it: its
    counts and scores, with nothing trained in this command."""
    return dict(report, steps_this_command=0, examples_trained=0, train_seconds=0.0,
                real_tokens_per_second=0.0, resumed_at_step=None, setup=dict(
                    report["setup"], passes=0, records=0, seconds={}, first_step_seconds=None))


def format_report(report: dict) -> str:
    lines = ["", "=" * 64, f"tfseq report: task={report['task']} ({report['mode']}, "
             f"{report['replicas']} replica(s) x {report['workers']} worker(s))"]
    for split, c in report["counters"].items():
        read = c["seen"].get("lines_read", 0)
        routed = c["drops"].get("other_split", 0)
        dropped = {k: v for k, v in c["drops"].items() if v and k != "other_split"}
        kept = read - routed - sum(dropped.values())
        other = "held out for eval" if split == "train" else "training records"
        lines.append(f"  {split:5s} records read {read:7,d}: {kept:6,d} examples, {routed:6,d} "
                     f"{other}, {sum(dropped.values()):4,d} dropped {dropped if dropped else ''}"
                     .rstrip())
        if split == "train" and report.get("sources"):
            lines.append("        (a mixture epoch: " + ", ".join(
                f"{os.path.basename(row['source'])} read {row['source_epochs']:.2f} times"
                for row in report["sources"]) + ")")
    if report.get("sources"):
        lines.extend("  " + line for line in format_sources(report["sources"]))
    lines.append(f"  padding efficiency of training batches: {report['padding_efficiency']:.3f}")
    this_command = report.get("steps_this_command", report["steps"])
    lines.append(f"  training: {report['steps']:,} steps in the run, {this_command:,} in this "
                 f"command ({report['train_seconds']:.1f} s, "
                 f"{report['real_tokens_per_second']:,.0f} real tokens/s, "
                 f"{report.get('examples_trained', 0):,} examples trained in this command)")
    if report.get("jit"):
        jit = report["jit"]
        lines.append(f"  XLA (--jit_compile): {jit['compiled_shapes']} training programs "
                     f"compiled, at most {jit['shape_budget']} batch shapes")
    setup = report["setup"]
    if setup["passes"] or setup["first_step_seconds"]:
        phases = ([f"{setup['passes']} read of the training files "
                   f"({setup['records']:,} records)"] * bool(setup["passes"])
                  + [f"{k} {v:.1f} s" for k, v in setup["seconds"].items()])
        if setup["first_step_seconds"]:
            phases.append(f"first step after {setup['first_step_seconds']:.1f} s")
        lines.append(f"  before the first step: {'; '.join(phases)}")
    if report.get("resumed_at_step") is not None:
        lines.append(f"  continued from step {report['resumed_at_step']} (the checkpoint of an "
                     "earlier command); the counts include the steps before it")
    for example in report.get("drop_examples", []):
        lines.append(f"  dropped: {example}")
    lines.extend(f"  warning: {line}" for line in drop_warnings(report))
    for key, value in report["eval"].items():
        lines.append(f"  held-out {key}: {value:.4f}")
    for key, value in report["baselines"].items():
        lines.append(f"  {key} baseline: {value:.4f}")
    if report["interrupted"]:
        lines.append("  (interrupted: run the same command again to resume)")
    lines.append("=" * 64)
    return "\n".join(lines)


# What changes a drop reason's count, for the warning when it is over WARN_DROP_SHARE.
DROP_FIXES = {
    "too_long": "raise --max_length, or --long_examples=truncate keeps them cut",
    "too_many_bytes": "the lines are over the line-length limit: split them",
    "malformed": "check --format, --columns (FIELD=KEY reads a field of another name) and "
                 "--header; the 'dropped' lines say what is wrong",
    "invalid_utf8": "the files are not UTF-8: convert them",
    "nul_byte": "the files hold NUL bytes: are they text?",
    "empty_text": "empty text fields: check --columns",
    "empty": "empty lines or fields: check --columns",
    "unknown_label": "labels the run does not know: check the eval files' labels",
    "too_short": "lines too short to train on (lm needs 2 tokens)",
    "unequal_counts": "tokens and tags differ in count: check --columns",
}
WARN_DROP_SHARE = 0.05


def drop_warnings(report: dict) -> list[str]:
    """A line for every drop reason over 5% of a split's records (held-out routing aside),
    with what changes it."""
    lines = []
    for split, counter in report["counters"].items():
        records = counter["seen"].get("lines_read", 0) - counter["drops"].get("other_split", 0)
        for reason, n in sorted(counter["drops"].items()):
            if reason == "other_split" or not records or n <= WARN_DROP_SHARE * records:
                continue
            fix = DROP_FIXES.get(reason, "see the drop counts")
            if reason == "too_long":
                fix = f"--max_length={report['config'].get('max_length')}: {fix}"
            lines.append(f"{n / records:.0%} of the {split} records dropped as {reason} "
                         f"({fix})")
    return lines


def write_report(path: str, report: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=2, default=str)
    os.replace(path + ".tmp", path)


def drop_examples_of(task, config, counters, limit: int = 5) -> list[str]:
    """The first ``file:line: reason`` of malformed records, when some were dropped."""
    dropped = any(n for c in counters.values() for r, n in c.drops().items()
                  if r in ("malformed", "invalid_utf8", "empty_text", "unequal_counts"))
    return task.drop_examples(config, limit) if dropped else []
