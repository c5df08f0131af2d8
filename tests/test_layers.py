"""The import layering of the package, read from the source (AST), so no upward import creeps in.

The flow, bottom to top: the data contract (`types`, `trajectory`, `extra_keys`, and the small
`files` / `config_errors` helpers) <- `envs`, `models` <- `rewards`, `advantages`, `credit`,
`losses` <- `rollout`, `parallel` <- `learner`, `offline`, `studies`, `viewer`. A module may import
its own stage and anything below it, never above; some stages of one rank must not import each
other either. Imports inside functions count too. There is no list of exceptions.
"""

import ast
import pathlib

import pytest

import agentrl_jax

PACKAGE = pathlib.Path(agentrl_jax.__file__).parent
RANK = {
    "types": 0, "trajectory": 0, "extra_keys": 0, "files": 0, "config_errors": 0,
    "envs": 1, "models": 1,
    "rewards": 2, "advantages": 2, "credit": 2, "losses": 2,
    "rollout": 3, "parallel": 3,
    "learner": 4, "offline": 4, "studies": 4, "viewer": 4,
}
# Stages of one rank that stay independent of each other (a shaper never needs an env, etc.).
PEERS_FORBIDDEN = {
    ("envs", "models"), ("models", "envs"), ("advantages", "rewards"), ("advantages", "credit"),
    ("losses", "credit"), ("losses", "rewards"), ("rewards", "credit"), ("rewards", "envs"),
    ("advantages", "envs"), ("credit", "envs"), ("losses", "envs"), ("rewards", "models"),
    ("advantages", "models"), ("learner", "viewer"), ("learner", "offline"),
    ("learner", "studies"), ("types", "trajectory"),
}


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = path.relative_to(root.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _stage(module: str) -> str | None:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 and parts[0] == "agentrl_jax" else None


def _imported(tree: ast.AST, module: str, is_package: bool):
  """Yields (line, dotted target) for every import in the file, nested ones included."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, alias.name
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = module.split(".")
        anchor = anchor if is_package else anchor[:-1]
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
      for alias in node.names:
        yield node.lineno, f"{base}.{alias.name}"


def violations(root: pathlib.Path = PACKAGE) -> list[str]:
  found = []
  for path in sorted(root.rglob("*.py")):
    module = _module_name(path, root)
    source = _stage(module)
    if source is None:
      continue  # the package's own __init__
    if source not in RANK:
      found.append(f"{path}: stage {source!r} has no rank in the layering; add it to RANK")
      continue
    tree = ast.parse(path.read_text(), str(path))
    for line, target in _imported(tree, module, path.name == "__init__.py"):
      dest = _stage(target)
      if dest is None or dest == source:
        continue
      if dest not in RANK:
        found.append(f"{path}:{line}: imports {target}, a stage with no rank")
      elif RANK[dest] > RANK[source] or (source, dest) in PEERS_FORBIDDEN:
        found.append(f"{path}:{line}: {source} -> {dest} ({target})")
  return found


def test_no_import_runs_up_the_flow():
  found = violations()
  assert not found, "imports against the layering:\n" + "\n".join(found)


def test_the_check_catches_an_upward_import(tmp_path):
  # A copy of the package's layout with one shaper that imports the learner must be flagged.
  fake = tmp_path / "agentrl_jax"
  (fake / "rewards").mkdir(parents=True)
  (fake / "__init__.py").write_text("")
  (fake / "rewards" / "__init__.py").write_text("")
  (fake / "rewards" / "bad.py").write_text(
      "def f():\n  from agentrl_jax.learner import pipeline\n  return pipeline\n")
  (fake / "rewards" / "good.py").write_text("from agentrl_jax import trajectory\n")
  (fake / "rewards" / "relative.py").write_text("from ..credit import gca\n")
  found = violations(fake)
  assert len(found) == 2, found
  assert any("rewards -> learner" in f for f in found)
  assert any("rewards -> credit" in f for f in found)


@pytest.mark.parametrize("stage", sorted(RANK))
def test_every_ranked_stage_exists(stage):
  assert (PACKAGE / stage).is_dir() or (PACKAGE / f"{stage}.py").is_file(), stage
