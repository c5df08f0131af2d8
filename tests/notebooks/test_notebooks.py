"""Executes every study notebook at SMALL size and checks what it wrote.

Each notebook is a jupytext percent-format script whose last cells assert its own results, so a
zero exit status means those checks passed. Outputs go to a temporary directory, never over the
committed full-size figures.
"""

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
# SMALL runs take 10-60 s each on 2 idle CPU cores (credit_comparison, six learner runs, is the
# longest); the limit leaves room for a machine shared with other jobs.
TIMEOUT_S = 600


def _cells(path):
  """Splits a percent-format file into (kind, text) cells after the jupytext header."""
  cells = []
  for line in path.read_text().splitlines():
    if line.startswith("# %%"):
      cells.append(["markdown" if "[markdown]" in line else "code", ""])
    elif cells:
      cells[-1][1] += line + "\n"
  return cells


def test_notebooks_found():
  assert {p.stem for p in NOTEBOOKS} >= {"snr_scaling", "step_gap", "credit_comparison",
                                         "transformer_snr"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_layout(path):
  text = path.read_text()
  assert text.startswith("# ---\n# jupyter:\n#   jupytext:"), "missing the jupytext header"
  cells = _cells(path)
  kind, first = cells[0]
  assert kind == "markdown" and "Hardware and runtime assumed" in first, first[:200]
  assert "SMALL = os.environ.get(\"SMALL\", \"0\") == \"1\"" in text
  # Notebooks hold no library logic: no function or class definitions (lambdas for plot
  # formatting are fine); the simulation and statistics are imported from agentrl_jax.studies.
  definitions = [node.name for node in ast.walk(ast.parse(text))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
  assert not definitions, definitions


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_paired_ipynb_has_the_scripts_code(path):
  # The .ipynb is what a reader opens; a script edited without `jupytext --sync` leaves it stale.
  cells = json.loads(path.with_suffix(".ipynb").read_text())["cells"]
  in_notebook = ["".join(c["source"]).strip() for c in cells if c["cell_type"] == "code"]
  in_script = [text.strip() for kind, text in _cells(path) if kind == "code"]
  assert in_notebook == in_script


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_small(path, tmp_path):
  env = dict(os.environ, SMALL="1", STUDY_OUTPUT_DIR=str(tmp_path),
             STUDY_RUNS_DIR=str(tmp_path / "runs"), MPLBACKEND="Agg",
             JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
                 [str(ROOT), os.environ.get("PYTHONPATH", "")]))
  # One CPU device is enough and keeps start-up cheap (the test session forces 8 fake ones).
  env["XLA_FLAGS"] = os.environ.get("AGENTRL_JAX_TEST_COMPILE_FLAGS", "")
  result = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "all checks passed" in result.stdout
  figure = tmp_path / "figures" / f"{path.stem}.png"
  assert figure.stat().st_size > 10_000, figure
  results = json.loads((tmp_path / "results" / f"{path.stem}.json").read_text())
  assert results["small"] is True
