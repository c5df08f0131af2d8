"""Static HTML reports of trajectories with their token advantages under several credit pipelines.

A report is one self-contained HTML file (inline CSS and SVG, no script, no network) that shows a
few trajectories as conversations, turn by turn: the observation as plain text, then the action
tokens shaded by their final advantage, once per pipeline side by side, so that the credit GRPO,
GiGPO or GRPO+GCA gives the same tokens can be compared at a glance. Every number is on hover
(`title`) and in a `data-adv` attribute that round-trips to the exact float32.

Files under `<workdir>/viewer/`:

  iter_<n>.html   the report of iteration n;
  iter_<n>.json   its summary (success, repeated-action and invalid-action rates, metrics);
  index.html      every report, with a chart of success over iterations read from
                  `<workdir>/metrics.jsonl`.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
import re
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from etils import epath

from agentrl_jax import config_errors
from agentrl_jax import files
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.learner import hooks
from agentrl_jax.learner import metrics as metrics_lib

VIEWER_DIR = "viewer"
INDEX_FILE = "index.html"

# A pipeline scores a batch: fn(traj, values [B, L] | None) -> AdvantageOutput.
Pipeline = Callable[..., estimators.AdvantageOutput]

# Diverging scale ends (ColorBrewer RdBu): negative credit red, positive blue, zero white.
_NEGATIVE_RGB = (202, 0, 32)
_POSITIVE_RGB = (5, 113, 176)
_WHITE_RGB = (255, 255, 255)
_LEGEND_STEPS = 11
_CHART_WIDTH, _CHART_HEIGHT, _CHART_PAD = 480, 160, 32


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ViewerConfig:
  """What the trajectory viewer shows.

  Attributes:
    num_examples: trajectories shown per report.
    estimators: registered estimator names (`advantages.estimators.ESTIMATORS`), each scored as
      its own pipeline with default hyperparameters.
    pipelines: further named pipelines, `fn(traj, values) -> AdvantageOutput`, e.g. a
      `learner.pipeline.CreditPipeline` with corrections; shown after the estimators.
  """

  num_examples: int = 4
  estimators: tuple[str, ...] = ("grpo", "gigpo")
  pipelines: Mapping[str, Pipeline] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.num_examples < 1:
      raise ValueError(f"ViewerConfig.num_examples must be >= 1, got {self.num_examples!r}")
    for name in self.estimators:
      estimators.get_estimator(name)  # Raises, listing the known names.
    clash = sorted(set(self.estimators) & set(self.pipelines))
    if clash:
      raise ValueError(f"ViewerConfig: pipeline name(s) {clash} also listed in estimators")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CreditReport:
  """Learner hook: the credit report of the iteration's batch at every held-out evaluation.

  The run's own pipeline comes first (when it needs no critic), then the viewer's.
  """

  config: ViewerConfig = ViewerConfig()

  def __call__(self, event: hooks.IterationEnd) -> None:
    if not event.evaluating:
      return
    own = {} if event.pipeline is None else {f"run: {event.pipeline[0]}": event.pipeline[1]}
    write_report(event.workdir, event.iteration, event.traj, event.tokenizer,
                 make_pipelines(self.config, extra=own), num_examples=self.config.num_examples,
                 env_name=event.env_name, metrics=event.metrics, writer=event.writer)


def make_pipelines(config: ViewerConfig,
                   extra: Mapping[str, Pipeline] | None = None) -> dict[str, Pipeline]:
  """The named pipelines of `config`, preceded by `extra` (e.g. the run's own pipeline)."""
  pipelines: dict[str, Pipeline] = dict(extra or {})
  for name in config.estimators:
    pipelines[name] = estimators.get_estimator(name)
  pipelines.update(config.pipelines)
  return pipelines


def score_pipelines(traj: types.Trajectories, pipelines: Mapping[str, Pipeline],
                    values: Any = None) -> dict[str, np.ndarray]:
  """Token advantages `[B, L]` float32 (NumPy) of the whole batch under each pipeline.

  The whole batch is scored, not only the rows shown: group baselines need every member.

  Raises:
    ValueError: naming the pipeline, when one fails (e.g. it needs critic values and `values`
      is None).
  """
  scores = {}
  for name, pipeline in pipelines.items():
    try:
      out = pipeline(traj, values)
    except (ValueError, TypeError) as e:
      raise ValueError(f"viewer pipeline {name!r} failed: {e}") from e
    scores[name] = np.asarray(out.advantages, np.float32)
  return scores


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TokenView:
  """One action token: its id, its text, and its advantage under each pipeline."""

  position: int
  token_id: int
  text: str
  advantages: dict[str, float]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TurnView:
  """One turn: the observation that opened it, the action tokens, and the env's feedback."""

  index: int
  observation: str
  tokens: tuple[TokenView, ...]
  reward: float
  done: bool
  action_valid: bool
  env_error: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TrajectoryView:
  """A trajectory ready to render: every existing turn, in order."""

  row: int
  group_id: int
  outcome: float
  success: bool
  sub_outcomes: dict[str, float]
  turns: tuple[TurnView, ...]


def _host(traj: types.Trajectories) -> types.Trajectories:
  """The batch as NumPy arrays (device arrays are copied once, explicitly)."""
  return jax.tree.map(np.asarray, jax.device_get(traj))


def token_text(tokenizer, token_id: int) -> str:
  """The text of one token id, decoded alone; its vocabulary piece when it decodes to nothing."""
  text = tokenizer.decode([token_id])
  return text if text else tokenizer.pieces([token_id])[0]


def trajectory_view(traj: types.Trajectories, tokenizer, row: int,
                    advantages: Mapping[str, np.ndarray]) -> TrajectoryView:
  """Extracts row `row` of a batch: turns, observation text, action tokens and their advantages.

  The observation of turn k is every non-action token of turn k, decoded as one text without the
  `<|obs|>`/`<|act|>` markers; action tokens are decoded one id at a time.
  """
  traj = _host(traj)
  b = traj.batch_size
  if not 0 <= row < b:
    raise ValueError(f"trajectory row {row} out of range for a batch of {b}")
  for name, adv in advantages.items():
    if np.shape(adv) != traj.tokens.shape:
      raise ValueError(f"advantages of pipeline {name!r} have shape {list(np.shape(adv))}, "
                       f"expected {list(traj.tokens.shape)} like traj.tokens")
  markers = {tokenizer.obs_id, tokenizer.act_id}
  tokens = traj.tokens[row]
  turn_of_token = traj.turn_of_token[row]
  action_mask = traj.action_mask[row].astype(bool)
  turns = []
  for k in np.flatnonzero(traj.turn_mask[row]):
    in_turn = turn_of_token == k
    obs_ids = [int(t) for t in tokens[in_turn & ~action_mask] if int(t) not in markers]
    action_positions = np.flatnonzero(in_turn & action_mask)
    views = tuple(
        TokenView(position=int(p), token_id=int(tokens[p]),
                  text=token_text(tokenizer, int(tokens[p])),
                  advantages={name: float(adv[row, p]) for name, adv in advantages.items()})
        for p in action_positions)
    turns.append(TurnView(
        index=int(k), observation=tokenizer.decode(obs_ids), tokens=views,
        reward=float(traj.reward[row, k]), done=bool(traj.done[row, k]),
        action_valid=bool(traj.action_valid[row, k]), env_error=bool(traj.env_error[row, k])))
  return TrajectoryView(
      row=row, group_id=int(traj.group_id[row]), outcome=float(traj.outcome[row]),
      success=bool(traj.success[row]),
      sub_outcomes={name: float(v[row]) for name, v in sorted(traj.sub_outcomes.items())},
      turns=tuple(turns))


def select_rows(traj: types.Trajectories, num_examples: int) -> list[int]:
  """Rows worth showing: whole groups, those with both successes and failures first.

  A group whose members differ in outcome is where estimators disagree most; showing the whole
  group lets the reader see the baseline each advantage is relative to.
  """
  traj = _host(traj)
  groups: dict[int, list[int]] = {}
  for row, group in enumerate(traj.group_id.tolist()):
    groups.setdefault(int(group), []).append(row)
  mixed = lambda rows: len({float(traj.outcome[r]) for r in rows}) > 1
  ordered = sorted(groups.values(), key=lambda rows: (not mixed(rows), rows[0]))
  chosen: list[int] = []
  for rows in ordered:
    chosen.extend(rows[:num_examples - len(chosen)])
    if len(chosen) >= num_examples:
      break
  return sorted(chosen)


def action_rates(traj: types.Trajectories) -> dict[str, float]:
  """Success, repeated-action and invalid-action rates of a batch.

  repeated_action_rate: among turns k >= 1, the fraction whose action tokens equal those of
    turn k-1 of the same trajectory.
  invalid_action_rate: among all turns, the fraction the env rejected.
  """
  traj = _host(traj)
  repeated = followers = invalid = turns = 0
  for b in range(traj.batch_size):
    previous = None
    for k in np.flatnonzero(traj.turn_mask[b]):
      action = traj.tokens[b, traj.turn_start[b, k]:traj.turn_end[b, k]].tolist()
      turns += 1
      invalid += int(not traj.action_valid[b, k] and not traj.env_error[b, k])
      if previous is not None:
        followers += 1
        repeated += int(action == previous)
      previous = action
  return {
      "success": float(np.mean(traj.success)) if traj.batch_size else 0.0,
      "repeated_action_rate": repeated / followers if followers else 0.0,
      "invalid_action_rate": invalid / turns if turns else 0.0,
  }


def advantage_color(value: float, scale: float) -> str:
  """`rgb(...)` on the diverging scale: red for -scale, white for 0, blue for +scale."""
  if not math.isfinite(value):
    return "rgb(160,160,160)"
  t = 0.0 if scale <= 0 else max(-1.0, min(1.0, value / scale))
  end = _POSITIVE_RGB if t > 0 else _NEGATIVE_RGB
  rgb = [round(w + abs(t) * (e - w)) for w, e in zip(_WHITE_RGB, end)]
  return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})"


def text_color(value: float, scale: float) -> str:
  """Dark text on light shades, white text on the saturated ends (kept readable)."""
  return "#fff" if scale > 0 and math.isfinite(value) and abs(value) > 0.6 * scale else "#111"


def color_scale(views: Sequence[TrajectoryView]) -> float:
  """One scale for every pipeline: the largest |advantage| shown (1 when all are zero)."""
  largest = 0.0
  for view in views:
    for turn in view.turns:
      for token in turn.tokens:
        for value in token.advantages.values():
          if math.isfinite(value):
            largest = max(largest, abs(value))
  return largest or 1.0


def _number(value: float) -> str:
  """The exact float (shortest repr that round-trips), as written in `data-adv`."""
  return repr(float(value))


def _signed(value: float) -> str:
  return f"{value:+.4f}"


def render_legend(scale: float) -> str:
  """The colour legend: swatches from -scale to +scale with their values."""
  cells = []
  for i in range(_LEGEND_STEPS):
    value = scale * (2 * i / (_LEGEND_STEPS - 1) - 1)
    cells.append(f'<span class="swatch" style="background:{advantage_color(value, scale)};'
                 f'color:{text_color(value, scale)}" '
                 f'title="advantage {_signed(value)}">{value:+.2g}</span>')
  return ('<div class="legend" id="legend"><span class="legend-title">advantage</span>'
          f'{"".join(cells)}<span class="legend-note">red: credit taken away, blue: credit '
          'given; hover a token for its exact value</span></div>')


_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 6px}
h2{font-size:16px;margin:24px 0 6px}
.meta{color:#555;font-size:13px}
table.turns{border-collapse:collapse;width:100%;margin-top:6px;font-size:13px}
table.turns th,table.turns td{border:1px solid #ddd;padding:4px 6px;vertical-align:top}
table.turns th{background:#f4f4f4;text-align:left}
pre.obs{margin:0;font-family:ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;
 font-size:12px}
.tok{font-family:ui-monospace,Menlo,Consolas,monospace;padding:1px 3px;margin:0 1px;
 border:1px solid #bbb;border-radius:3px;white-space:pre}
.adv{display:block;color:#555;font-size:11px;margin-top:2px}
.legend{display:flex;align-items:center;gap:2px;margin:10px 0;font-size:11px;flex-wrap:wrap}
.legend-title{font-weight:600;margin-right:6px}
.legend-note{color:#555;margin-left:8px}
.swatch{display:inline-block;min-width:38px;text-align:center;padding:3px 0;border:1px solid #ccc}
.ok{color:#1a7f37}
.bad{color:#b42318}
.err{color:#fff;background:#b42318;padding:0 4px;border-radius:3px}
table.index{border-collapse:collapse;font-size:13px}
table.index td,table.index th{border:1px solid #ddd;padding:4px 8px}
"""


def _page(title: str, body: str) -> str:
  return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
          f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
          f"{body}\n</body>\n</html>\n")


def _token_html(token: TokenView, pipeline: str, scale: float) -> str:
  value = token.advantages[pipeline]
  title = (f"{pipeline}: advantage {_signed(value)} | token {token.text!r} (id {token.token_id}, "
           f"position {token.position})")
  return (f'<span class="tok" data-pipeline="{html.escape(pipeline)}" '
          f'data-position="{token.position}" data-token-id="{token.token_id}" '
          f'data-adv="{_number(value)}" style="background:{advantage_color(value, scale)};'
          f'color:{text_color(value, scale)}" '
          f'title="{html.escape(title)}">{html.escape(token.text)}</span>')


def _verdict(success: bool) -> str:
  return '<span class="ok">success</span>' if success else '<span class="bad">failure</span>'


def _turn_status(turn: TurnView, view: TrajectoryView) -> str:
  parts = [f'reward <b>{turn.reward:+.3g}</b>']
  if turn.env_error:
    parts.append('<span class="err">env error</span>')
  elif not turn.action_valid:
    parts.append('<span class="bad">invalid action</span>')
  if turn.done:
    verdict = _verdict(view.success)
    parts.append(f'done: {verdict}, outcome {view.outcome:+.3g}')
    parts.extend(f'{html.escape(name)} = {value:.3g}' for name, value in view.sub_outcomes.items())
  return "<br>".join(parts)


def render_trajectory_html(view: TrajectoryView, pipelines: Sequence[str], scale: float) -> str:
  """One trajectory as a table: a row per turn, a column of shaded action tokens per pipeline."""
  verdict = _verdict(view.success)
  subs = "".join(f", {html.escape(n)} = {v:.3g}" for n, v in view.sub_outcomes.items())
  header = (f'<h2>Trajectory {view.row} <span class="meta">group {view.group_id} · {verdict} · '
            f'outcome {view.outcome:+.3g}{subs} · {len(view.turns)} turns</span></h2>')
  head = "".join(f'<th>{html.escape(name)}</th>' for name in pipelines)
  rows = []
  for turn in view.turns:
    cells = []
    for name in pipelines:
      spans = (" ".join(_token_html(t, name, scale) for t in turn.tokens)
               or '<span class="meta">(no tokens)</span>')
      total = sum(t.advantages[name] for t in turn.tokens)
      cells.append(f'<td class="action">{spans}<span class="adv">sum {_signed(total)}</span></td>')
    rows.append(
        f'<tr class="turn" data-turn="{turn.index}"><td>{turn.index}</td>'
        f'<td><pre class="obs">{html.escape(turn.observation)}</pre></td>{"".join(cells)}'
        f'<td class="status">{_turn_status(turn, view)}</td></tr>')
  return (f'<section class="trajectory" data-row="{view.row}" data-group="{view.group_id}">'
          f'{header}<table class="turns"><thead><tr><th>turn</th><th>observation</th>{head}'
          f'<th>env feedback</th></tr></thead><tbody>{"".join(rows)}</tbody></table></section>')


def render_report(trajectories: types.Trajectories, tokenizer,
                  pipelines: Mapping[str, np.ndarray], num_examples: int, iteration: int, *,
                  env_name: str = "", rows: Sequence[int] | None = None) -> str:
  """The HTML report of one iteration.

  Args:
    trajectories: the batch (host or device arrays).
    tokenizer: an `agentrl_jax.models.tokenizer.Tokenizer` (or anything with `decode`, `pieces`,
      `obs_id`, `act_id`).
    pipelines: pipeline name -> token advantages `[B, L]` of the whole batch (`score_pipelines`).
    num_examples: trajectories shown when `rows` is None (chosen by `select_rows`).
    iteration: the training iteration, for the title.
    env_name: the environment, for the title.
    rows: explicit rows to show instead.

  Returns:
    A complete HTML document.
  """
  if not pipelines:
    raise ValueError("render_report needs at least one pipeline's advantages")
  if num_examples < 1:
    raise ValueError(f"num_examples must be >= 1, got {num_examples!r}")
  rows = list(rows) if rows is not None else select_rows(trajectories, num_examples)
  views = [trajectory_view(trajectories, tokenizer, r, pipelines) for r in rows]
  scale = color_scale(views)
  names = list(pipelines)
  rates = action_rates(trajectories)
  env = f" · {html.escape(env_name)}" if env_name else ""
  body = [
      f'<h1>Iteration {int(iteration)}{env}</h1>',
      f'<p class="meta">{trajectories.batch_size} trajectories in the batch; {len(views)} shown. '
      f'Batch success {rates["success"]:.3f}, repeated-action rate '
      f'{rates["repeated_action_rate"]:.3f}, invalid-action rate '
      f'{rates["invalid_action_rate"]:.3f}. Pipelines: {html.escape(", ".join(names))}. '
      '<a href="index.html">All iterations</a></p>',
      render_legend(scale),
      *(render_trajectory_html(view, names, scale) for view in views),
  ]
  return _page(f"Iteration {int(iteration)}{' · ' + env_name if env_name else ''}", "\n".join(body))


def _success_chart(points: Sequence[tuple[int, float]],
                   eval_points: Sequence[tuple[int, float]]) -> str:
  """Inline SVG of success over iterations (training batch line, held-out eval dots)."""
  all_points = list(points) + list(eval_points)
  if not all_points:
    return '<p class="meta">No success metrics recorded yet.</p>'
  lo = min(s for s, _ in all_points)
  hi = max(s for s, _ in all_points)
  span = max(hi - lo, 1)
  w, h, pad = _CHART_WIDTH, _CHART_HEIGHT, _CHART_PAD
  x = lambda step: pad + (step - lo) / span * (w - 2 * pad)
  y = lambda value: h - pad + (-(h - 2 * pad) * min(max(value, 0.0), 1.0))
  parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" role="img" aria-label="success over iterations">',
           f'<rect x="0" y="0" width="{w}" height="{h}" fill="#fff"/>',
           f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#888"/>',
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#888"/>',
           f'<text x="4" y="{pad + 4}" font-size="10">1.0</text>',
           f'<text x="4" y="{h - pad + 4}" font-size="10">0.0</text>',
           f'<text x="{pad}" y="{h - 8}" font-size="10">{lo}</text>',
           f'<text x="{w - pad}" y="{h - 8}" font-size="10" text-anchor="end">{hi}</text>']
  if points:
    coords = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
    parts.append(f'<polyline class="train" points="{coords}" fill="none" '
                 f'stroke="{_rgb(_POSITIVE_RGB)}" stroke-width="2"/>')
  for s, v in eval_points:
    parts.append(f'<circle class="eval" cx="{x(s):.1f}" cy="{y(v):.1f}" r="3" '
                 f'fill="{_rgb(_NEGATIVE_RGB)}">'
                 f'<title>iteration {s}: held-out greedy success {v:.3f}</title></circle>')
  parts.append("</svg>")
  legend = (f'<p class="meta"><span style="color:{_rgb(_POSITIVE_RGB)}">line: training-batch '
            f'success</span> · <span style="color:{_rgb(_NEGATIVE_RGB)}">dots: held-out greedy '
            'success</span></p>')
  return "".join(parts) + legend


def _rgb(rgb: tuple[int, int, int]) -> str:
  return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})"


def render_index(entries: Sequence[Mapping[str, Any]],
                 metrics: Sequence[Mapping[str, float]] = ()) -> str:
  """The index page: one row per report, and a chart of success over iterations.

  Args:
    entries: one mapping per report with `iteration`, `success`, `repeated_action_rate`,
      `invalid_action_rate` and optionally `eval_success` and `file` (default `iter_<n>.html`).
    metrics: records of `metrics.jsonl`; their `train/success` and `eval/greedy_success` draw
      the chart (the entries' success when there are none).
  """
  entries = sorted(entries, key=lambda e: int(e["iteration"]))
  train = sorted({int(r["step"]): float(r["train/success"]) for r in metrics
                  if "train/success" in r and "step" in r}.items())
  evals = sorted({int(r["step"]): float(r["eval/greedy_success"]) for r in metrics
                  if "eval/greedy_success" in r and "step" in r}.items())
  if not train:
    train = [(int(e["iteration"]), float(e["success"])) for e in entries]
  rows = []
  for e in entries:
    n = int(e["iteration"])
    target = html.escape(str(e.get("file", f"iter_{n}.html")))
    eval_success = e.get("eval_success")
    rows.append(
        f'<tr class="iteration" data-iteration="{n}"><td><a href="{target}">{n}</a></td>'
        f'<td>{float(e["success"]):.3f}</td>'
        f'<td>{"" if eval_success is None else f"{float(eval_success):.3f}"}</td>'
        f'<td>{float(e["repeated_action_rate"]):.3f}</td>'
        f'<td>{float(e["invalid_action_rate"]):.3f}</td></tr>')
  table = ('<table class="index"><thead><tr><th>iteration</th><th>success (report batch)</th>'
           '<th>held-out success</th><th>repeated-action rate</th><th>invalid-action rate</th>'
           f'</tr></thead><tbody>{"".join(rows)}</tbody></table>')
  body = ["<h1>Trajectory reports</h1>", "<h2>Success over iterations</h2>",
          _success_chart(train, evals), "<h2>Reports</h2>", table]
  return _page("Trajectory reports", "\n".join(body))


def trajectory_text_summary(trajectories: types.Trajectories, tokenizer,
                            pipelines: Mapping[str, np.ndarray], row: int) -> str:
  """One trajectory as Markdown text (for TensorBoard): turns, actions and their advantages."""
  view = trajectory_view(trajectories, tokenizer, row, pipelines)
  lines = [f"**trajectory {view.row}** (group {view.group_id}): "
           f"{'success' if view.success else 'failure'}, outcome {view.outcome:+.3g}"
           + "".join(f", {n} = {v:.3g}" for n, v in view.sub_outcomes.items()), ""]
  for turn in view.turns:
    action = "".join(t.text for t in turn.tokens)
    credit = "; ".join(
        f"{name} " + " ".join(_signed(t.advantages[name]) for t in turn.tokens) for name in pipelines)
    flags = " [env error]" if turn.env_error else (" [invalid]" if not turn.action_valid else "")
    observation = turn.observation.replace("\n", " / ")
    lines.append(f"- turn {turn.index}: obs `{observation}` → action `{action}`{flags}, "
                 f"reward {turn.reward:+.3g} | {credit}")
  return "\n".join(lines)


def report_path(workdir: str | os.PathLike[str], iteration: int) -> str:
  """`<workdir>/viewer/iter_<iteration>.html` (a local path or a gs:// URL)."""
  return os.path.join(os.fspath(workdir), VIEWER_DIR, f"iter_{int(iteration)}.html")


def _write_text(path: str, text: str) -> None:
  files.write_text(path, text)


def read_entries(workdir: str | os.PathLike[str]) -> list[dict[str, Any]]:
  """The summaries of every report in `<workdir>/viewer/`, by iteration."""
  directory = epath.Path(os.fspath(workdir)) / VIEWER_DIR
  if not directory.exists():
    return []
  entries = [json.loads(path.read_text()) for path in directory.glob("iter_*.json")
             if re.fullmatch(r"iter_\d+\.json", path.name)]
  return sorted(entries, key=lambda e: int(e["iteration"]))


def write_index(workdir: str | os.PathLike[str]) -> str:
  """(Re)writes `<workdir>/viewer/index.html` from the report summaries and `metrics.jsonl`."""
  path = os.path.join(os.fspath(workdir), VIEWER_DIR, INDEX_FILE)
  _write_text(path, render_index(read_entries(workdir), metrics_lib.read_metrics(workdir)))
  return path


def write_report(workdir: str | os.PathLike[str], iteration: int, trajectories: types.Trajectories,
                 tokenizer, pipelines: Mapping[str, Pipeline], *, num_examples: int = 4,
                 values: Any = None, env_name: str = "",
                 metrics: Mapping[str, float] | None = None, writer=None) -> str:
  """Scores `trajectories` with every pipeline and writes the report of `iteration`.

  Writes `<workdir>/viewer/iter_<iteration>.html` and its summary `iter_<iteration>.json`, then
  rewrites `index.html`. With a `learner.metrics.MetricsWriter`, also records one trajectory as
  text under the TensorBoard tag `viewer/trajectory`.

  Args:
    workdir: the run's workdir.
    iteration: the training iteration the batch comes from.
    trajectories: the batch (whole, so group baselines are right).
    tokenizer: the run's tokenizer.
    pipelines: name -> `fn(traj, values) -> AdvantageOutput` (`make_pipelines`).
    num_examples: trajectories shown.
    values: critic values `[B, L]` for pipelines that need them, else None.
    env_name: shown in the title.
    metrics: this iteration's scalars; `eval/greedy_success` is copied into the index.
    writer: a MetricsWriter, or None.

  Returns:
    The path of the HTML report.
  """
  scores = score_pipelines(trajectories, pipelines, values)
  rows = select_rows(trajectories, num_examples)
  path = report_path(workdir, iteration)
  _write_text(path, render_report(trajectories, tokenizer, scores, num_examples, iteration,
                                        env_name=env_name, rows=rows))
  entry: dict[str, Any] = {"iteration": int(iteration), "file": os.path.basename(path),
                           **action_rates(trajectories)}
  if metrics and "eval/greedy_success" in metrics:
    entry["eval_success"] = float(metrics["eval/greedy_success"])
  _write_text(path[:-len(".html")] + ".json", json.dumps(entry))
  write_index(workdir)
  if writer is not None:
    writer.write_text(iteration, "viewer/trajectory",
                      trajectory_text_summary(trajectories, tokenizer, scores, rows[0]))
  return path
