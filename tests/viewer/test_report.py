"""Tests for agentrl_jax.viewer.report: the HTML lists every turn and token with its exact credit."""

import html.parser
import json
import os

import numpy as np
import pytest

from agentrl_jax.advantages import estimators
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.viewer import report


class _Collector(html.parser.HTMLParser):
  """Records start tags with their attributes, the text inside each token span, and all text."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.tags: list[tuple[str, dict[str, str]]] = []
    self.open: list[str] = []
    self.section_row: int | None = None
    self.turn: int | None = None
    self.tokens: list[dict[str, str]] = []  # each: attributes + row, turn, text
    self.turns: list[tuple[int, int]] = []
    self.text: list[str] = []
    self._in_token: dict[str, str] | None = None

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    self.tags.append((tag, attrs))
    if tag not in ("meta", "br"):  # the void elements the viewer writes
      self.open.append(tag)
    if tag == "section" and "data-row" in attrs:
      self.section_row = int(attrs["data-row"])
    if tag == "tr" and "data-turn" in attrs:
      self.turn = int(attrs["data-turn"])
      self.turns.append((self.section_row, self.turn))
    if tag == "span" and "tok" in attrs.get("class", "").split():
      self._in_token = {**attrs, "row": self.section_row, "turn": self.turn, "text": ""}

  def handle_startendtag(self, tag, attrs):
    self.tags.append((tag, dict(attrs)))

  def handle_endtag(self, tag):
    assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1:]}>"
    self.open.pop()
    if tag == "span" and self._in_token is not None:
      self.tokens.append(self._in_token)
      self._in_token = None

  def handle_data(self, data):
    self.text.append(data)
    if self._in_token is not None:
      self._in_token["text"] += data


def _parse(document: str) -> _Collector:
  parser = _Collector()
  parser.feed(document)
  parser.close()
  assert parser.open == [], f"unclosed tags {parser.open}"
  return parser


def test_every_turn_and_action_token_carries_its_exact_advantage(tok, traj, advantages, episodes):
  rows = [0, 1, 2, 3]
  page = _parse(report.render_report(traj, tok, advantages, 4, 12, rows=rows))

  expected_turns = [(b, k) for b in rows for k in range(len(episodes[b]))]
  assert page.turns == expected_turns
  seen = {}
  for token in page.tokens:
    key = (token["row"], int(token["data-position"]), token["data-pipeline"])
    assert key not in seen, f"token {key} rendered twice"
    seen[key] = token
  for b in rows:
    for p in np.flatnonzero(traj.action_mask[b]):
      for name, adv in advantages.items():
        token = seen.pop((b, int(p), name))
        # The attribute is the shortest repr of the float32 value, so it round-trips exactly.
        assert np.float32(float(token["data-adv"])) == adv[b, p]
        assert token["turn"] == traj.turn_of_token[b, p]
        assert int(token["data-token-id"]) == traj.tokens[b, p]
        assert token["text"] == tok.decode([int(traj.tokens[b, p])])
        assert f"{adv[b, p]:+.4f}" in token["title"]
  assert not seen, f"tokens rendered that are not action tokens: {sorted(seen)}"


def test_action_text_per_turn_matches_the_episode(tok, traj, advantages, episodes):
  page = _parse(report.render_report(traj, tok, advantages, 4, 0, rows=[3]))
  # Episode 3's one action "right left" is two tokens, shown once per pipeline.
  texts = [t["text"] for t in page.tokens if t["data-pipeline"] == "GRPO"]
  assert "".join(texts) == episodes[3][0][1]
  assert len(texts) == 2


def test_legend_is_present_with_the_scale_of_the_largest_credit(tok, traj, advantages):
  page = _parse(report.render_report(traj, tok, advantages, 4, 0, rows=[0, 1, 2, 3]))
  legends = [a for tag, a in page.tags if a.get("id") == "legend"]
  assert len(legends) == 1
  swatches = [a for tag, a in page.tags if "swatch" in a.get("class", "")]
  assert len(swatches) == 11
  largest = max(np.abs(a).max() for a in advantages.values())
  assert swatches[-1]["style"].startswith(f"background:{report.advantage_color(largest, largest)};")
  assert swatches[5]["style"].startswith("background:rgb(255,255,255);")


def test_observation_text_is_escaped(tok, traj, advantages):
  document = report.render_report(traj, tok, advantages, 4, 0, rows=[0])
  page = _parse(document)
  assert "script" not in [tag for tag, _ in page.tags]
  assert "&lt;script&gt;alert(1)&lt;/script&gt;" in document
  assert any("moved down <script>alert(1)</script>" in t for t in page.text)
  # Pipeline names are escaped too ("GiGPO <b>" is a name, not markup).
  assert "GiGPO &lt;b&gt;" in document and "GiGPO <b>" in page.text


def test_turn_feedback_shows_reward_outcome_sub_outcomes_and_errors(tok, traj, advantages):
  document = report.render_report(traj, tok, advantages, 4, 0, rows=[0, 1, 2])
  assert "invalid action" in document  # row 1, turn 0
  assert "env error" in document  # row 2, turn 2
  assert "reached_goal = 1" in document  # row 0's sub-outcome
  assert "outcome +1" in document


def test_select_rows_prefers_whole_groups_with_mixed_outcomes(make_trajectories):
  win = [("o", "down", 1.0, True, False)]
  lose = [("o", "up", 0.0, True, False)]
  # Group 3 (rows 0, 1) is uniform, group 5 (rows 2, 3, 4) mixed, group 7 (row 5) a singleton.
  traj = make_trajectories([lose, lose, win, lose, lose, win], [3, 3, 5, 5, 5, 7])
  assert report.select_rows(traj, 3) == [2, 3, 4]
  assert report.select_rows(traj, 4) == [0, 2, 3, 4]
  assert report.select_rows(traj, 10) == [0, 1, 2, 3, 4, 5]


def test_action_rates_by_hand(traj):
  rates = report.action_rates(traj)
  # Turns with a predecessor: row 0 turns 1-2 (down=down yes, right=down no), row 1 turn 1
  # (left vs jump no), row 2 turns 1-2 (up=up yes, up=up yes): 3 repeats of 5.
  assert rates["repeated_action_rate"] == pytest.approx(3 / 5)
  # 9 turns; row 1 turn 0 invalid (row 2's faulted turn counts as an env error, not invalid).
  assert rates["invalid_action_rate"] == pytest.approx(1 / 9)
  assert rates["success"] == pytest.approx(1 / 4)


def test_advantage_color_is_diverging_and_clipped():
  assert report.advantage_color(0.0, 2.0) == "rgb(255,255,255)"
  assert report.advantage_color(2.0, 2.0) == "rgb(5,113,176)"
  assert report.advantage_color(-5.0, 2.0) == "rgb(202,0,32)"
  # Half way to +scale: 255 + 0.5 * (5 - 255) = 130, 255 + 0.5 * (113 - 255) = 184, 215.5 -> 216.
  assert report.advantage_color(1.0, 2.0) == "rgb(130,184,216)"


def test_wrong_advantage_shape_names_the_pipeline(tok, traj):
  with pytest.raises(ValueError, match="'GRPO'"):
    report.render_report(traj, tok, {"GRPO": np.zeros((4, 3), np.float32)}, 2, 0)


def test_render_index_lists_iterations_and_draws_the_chart():
  entries = [{"iteration": 20, "success": 0.5, "repeated_action_rate": 0.1,
              "invalid_action_rate": 0.0, "eval_success": 0.6},
             {"iteration": 10, "success": 0.25, "repeated_action_rate": 0.2,
              "invalid_action_rate": 0.05}]
  records = [{"step": s, "train/success": s / 40} for s in range(1, 21)]
  records.append({"step": 20, "eval/greedy_success": 0.6})
  page = _parse(report.render_index(entries, records))
  rows = [int(a["data-iteration"]) for tag, a in page.tags if "data-iteration" in a]
  assert rows == [10, 20]
  assert ("a", {"href": "iter_10.html"}) in page.tags
  polyline = [a for tag, a in page.tags if tag == "polyline"]
  assert len(polyline) == 1 and len(polyline[0]["points"].split()) == 20
  assert len([1 for tag, _ in page.tags if tag == "circle"]) == 1


def test_write_report_files_index_and_text_summary(tmp_path, tok, traj):
  with metrics_lib.MetricsWriter(tmp_path) as writer:
    writer.write(5, {"train/success": 0.25})
  texts = []

  class _TextSink:
    def write_text(self, step, tag, text):
      texts.append((step, tag, text))

  pipelines = {"grpo": estimators.get_estimator("grpo"), "rloo": estimators.get_estimator("rloo")}
  path = report.write_report(tmp_path, 5, traj, tok, pipelines, num_examples=2,
                             metrics={"eval/greedy_success": 0.75}, writer=_TextSink())
  assert path == os.path.join(tmp_path, "viewer", "iter_5.html")
  page = _parse(open(path, encoding="utf-8").read())
  # Group 0 (rows 0, 1) has outcomes 1 and 0: mean 0.5, unbiased std sqrt(2 * 0.25 / 1), so
  # GRPO gives row 0's three tokens (1 - 0.5) / sqrt(0.5) = sqrt(0.5).
  grpo_row0 = [float(t["data-adv"]) for t in page.tokens
               if t["row"] == 0 and t["data-pipeline"] == "grpo"]
  assert grpo_row0 == pytest.approx([np.sqrt(0.5)] * 3, abs=1e-5)
  summary = json.load(open(os.path.join(tmp_path, "viewer", "iter_5.json")))
  assert summary["eval_success"] == 0.75
  index = _parse(open(os.path.join(tmp_path, "viewer", "index.html"), encoding="utf-8").read())
  assert ("a", {"href": "iter_5.html"}) in index.tags
  (step, tag, text), = texts
  assert (step, tag) == (5, "viewer/trajectory")
  assert "turn 2" in text and "right" in text


def test_trajectory_text_summary_lists_turns_and_credit(tok, traj, advantages):
  text = report.trajectory_text_summary(traj, tok, advantages, 0)
  for k, action in enumerate(["down", "down", "right"]):
    assert f"turn {k}:" in text and f"`{action}`" in text
  assert f"{advantages['GRPO'][0, traj.turn_start[0, 2]]:+.4f}" in text


def test_viewer_config_rejects_unknown_estimators():
  with pytest.raises(ValueError, match="'nope'"):
    report.ViewerConfig(estimators=("grpo", "nope"))
  with pytest.raises(ValueError, match="num_examples"):
    report.ViewerConfig(num_examples=0)
