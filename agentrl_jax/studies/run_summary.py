"""One run's held-out figures with their binomial intervals, read from its workdir.

What a single-seed run (a pretrained model on 2 cores affords one) can honestly report: each
held-out evaluation's success with its exact interval over the evaluated tasks, and the change
from the untrained (or warm-started) policy with Newcombe's interval for a difference of rates.
The learning suite's multi-seed intervals live in `learning_suite`; this is the per-run record.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any, Sequence

from agentrl_jax.studies import binomial

# Training metrics kept in the summary's curve, when a record has them.
CURVE_KEYS = ("train/success", "train/tied_groups", "rollout/invalid_action_rate", "loss/entropy",
              "loss/kl", "rollout/action_tokens_per_turn", "time/iteration_s", "memory/peak_rss_gb")
INTERVAL_NOTE = ("exact 95% Clopper-Pearson interval over the held-out tasks; the change from the "
                 "start with Newcombe's 95% interval for a difference of two rates")


def operative_value(config_text: str, name: str) -> str | None:
  """The value bound to `name` (e.g. 'configs.EvalConfig.num_tasks') in an operative config."""
  match = re.search(rf"^{re.escape(name)} = (.+)$", config_text, flags=re.MULTILINE)
  return match.group(1).strip() if match else None


def rate_record(rate: float, num_tasks: int) -> dict[str, Any]:
  """`{"success", "successes", "interval"}` of a rate measured on `num_tasks` tasks."""
  k = binomial.successes(rate, num_tasks)
  return {"success": k / num_tasks, "successes": k,
          "interval": [round(x, 4) for x in binomial.clopper_pearson(k, num_tasks)]}


def summarize(rows: Sequence[dict[str, Any]], *, num_tasks: int,
              planned_iterations: int | None = None) -> dict[str, Any]:
  """The summary of a run's metrics records (in the order written).

  Returns:
    `{"held_out_tasks", "interval", "start": {..., "from"}, "evaluations": [{"step", "success",
    "successes", "interval", "change", "change_interval", "invalid_action_rate",
    "mean_turns"}], "train_curve": [...], "iterations_done", "planned_iterations"}`. The start
    is the warm-started policy's evaluation when there is one, else the untrained one's; None
    when the run evaluated neither (then no change is reported).
  """
  start, evaluations, curve = None, [], []
  for row in rows:
    for tag in ("before", "warm_start"):
      if f"eval/greedy_success_{tag}" in row:
        start = dict(rate_record(row[f"eval/greedy_success_{tag}"], num_tasks), **{"from": tag})
        start["invalid_action_rate"] = row.get(f"eval/invalid_action_rate_{tag}")
    if "eval/greedy_success" in row:
      record = dict(step=int(row["step"]), **rate_record(row["eval/greedy_success"], num_tasks))
      record["invalid_action_rate"] = row.get("eval/invalid_action_rate")
      record["mean_turns"] = row.get("eval/mean_turns")
      evaluations.append(record)
    kept = {k: row[k] for k in CURVE_KEYS if k in row}
    if "train/success" in kept:
      curve.append(dict(step=int(row["step"]), **kept))
  for record in evaluations:
    if start is not None:
      record["change"] = round(record["success"] - start["success"], 4)
      record["change_interval"] = [round(x, 4) for x in binomial.newcombe_difference(
          record["successes"], num_tasks, start["successes"], num_tasks)]
  return {"held_out_tasks": num_tasks, "interval": INTERVAL_NOTE, "start": start,
          "evaluations": evaluations, "train_curve": curve,
          "iterations_done": max((c["step"] for c in curve), default=0),
          "planned_iterations": planned_iterations}


def summarize_workdir(workdir: str | pathlib.Path) -> dict[str, Any]:
  """`summarize` of a workdir's `metrics.jsonl`, sized by its operative `config.gin`.

  Raises:
    FileNotFoundError: the workdir has no metrics or no config.
    ValueError: the config binds no `EvalConfig.num_tasks` the rates could be counts of.
  """
  workdir = pathlib.Path(workdir)
  config_text = (workdir / "config.gin").read_text()
  tasks = operative_value(config_text, "configs.EvalConfig.num_tasks")
  if tasks is None:
    raise ValueError(f"{workdir}/config.gin binds no configs.EvalConfig.num_tasks")
  planned = operative_value(config_text, "configs.TrainConfig.num_iterations")
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
          if line.strip()]
  return summarize(rows, num_tasks=int(tasks),
                   planned_iterations=int(planned) if planned is not None else None)
