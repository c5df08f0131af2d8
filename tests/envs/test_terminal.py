"""Tests of the sandboxed terminal env and its in-memory shell."""

import pathlib
import random
import re
import uuid

import pytest

from agentrl_jax.envs import registry
from agentrl_jax.envs import terminal

# Measured with `_random_episode` over seeds 0..199: 0 successes (0.0%).
RANDOM_SUCCESS_BOUND = 0.05


def _expert_episode(env, seed):
  trace = [env.reset(seed)]
  while True:
    result = env.step(env.expert_action())
    trace.append(result)
    if result.done:
      return trace


def _random_episode(env, seed, rng):
  """Random commands over the current sandbox's paths; ends with submit or the step cap."""
  env.reset(seed)
  while True:
    paths = sorted(env.fs.dirs | set(env.fs.files))
    p, q = rng.choice(paths), rng.choice(paths)
    line = rng.choice([f"ls {p}", f"cd {p}", f"cat {p}", f"rm {p}", f"mkdir {p}/x", f"touch {p}",
                       f"mv {p} {q}", f"cp {p} {q}", f"wc -l {p}", f"echo hi > {p}", "submit"])
    result = env.step(line)
    if result.done:
      return result


def _shell(files=None, dirs=()):
  fs = terminal.FileSystem()
  for d in dirs:
    fs.make_dirs(d)
  for path, text in (files or {}).items():
    fs.write(path, text)
  return terminal.Shell(fs, cwd="/")


def test_registered():
  assert isinstance(registry.make("terminal"), terminal.Terminal)


@pytest.mark.parametrize("cwd, path, expected", [
    ("/", "a/b", "/a/b"),
    ("/a/b", "..", "/a"),
    ("/a/b", "../../..", "/"),
    ("/data", "../../etc/passwd", "/etc/passwd"),
    ("/x", "/y/./z/../w", "/y/w"),
])
def test_resolve_clamps_at_sandbox_root(cwd, path, expected):
  assert terminal.resolve(cwd, path) == expected


def test_shell_commands_on_a_small_tree():
  sh = _shell({"/d/a.csv": "1\n2\n", "/d/b.csv": "x\n", "/d/n.txt": "ERROR one\nok\nERROR two\n"})
  assert sh.run("ls /d") == "a.csv b.csv n.txt\n"
  assert sh.run("cat /d/a.csv /d/b.csv") == "1\n2\nx\n"
  # 3 lines, 5 words ("ERROR","one","ok","ERROR","two"), 23 characters in n.txt.
  assert sh.run("wc /d/n.txt") == "3 5 23 /d/n.txt\n"
  assert sh.run("grep -c ERROR /d/n.txt") == "2\n"
  assert sh.run("cat /d/n.txt | grep ERROR | wc -l") == "2\n"
  assert sh.run("head -n 1 /d/n.txt") == "ERROR one\n"
  assert sh.run("mkdir /e") == "" and sh.run("mv /d/*.csv /e") == ""
  assert sorted(sh.fs.children("/e")) == ["/e/a.csv", "/e/b.csv"]
  assert sh.run("echo hi > /e/h") == "" and sh.run("echo there >> /e/h") == ""
  assert sh.fs.files["/e/h"] == "hi\nthere\n"
  assert sh.run("find / -name *.csv") == "/e/a.csv\n/e/b.csv\n"
  sh.run("cd /e")
  assert sh.run("pwd") == "/e\n"
  assert sh.run("cp h h2") == "" and sh.fs.files["/e/h2"] == "hi\nthere\n"
  assert sh.run("rm /e") == "rm: /e: is a directory (use rm -r)"
  sh.run("rm -r /e")
  assert not sh.fs.exists("/e/h") and sh.cwd == "/"


def test_command_errors_are_output_not_exceptions():
  sh = _shell(dirs=["/d"])
  assert sh.run("cat /nope") == "/nope: no such file or directory"
  assert sh.run("cd /nope") == "cd: /nope: no such directory"
  assert sh.run("echo x > /missing/dir/f") == "/missing/dir/f: no such file or directory"
  assert sh.run("rm /") == "rm: refusing to remove '/'"
  assert sh.run("mv / /d") == "mv: refusing to mv '/'"
  assert sh.fs.is_dir("/d")


def test_paths_never_leave_the_sandbox():
  env = terminal.Terminal()
  env.reset(0)
  assert "no such file" in env.step("cat ../../../../etc/passwd").observation
  assert "no such file" in env.step("cat /etc/shadow").observation
  escape = f"agentrl_escape_{uuid.uuid4().hex}"
  env.step("mkdir -p /tmp")
  env.step(f"echo owned > ../../../../tmp/{escape}")
  # The write landed in the sandbox's /tmp, and nowhere on the host.
  assert env.fs.files[f"/tmp/{escape}"] == "owned\n"
  assert not pathlib.Path("/tmp", escape).exists()
  assert not pathlib.Path.cwd().joinpath(escape).exists()


def test_module_never_imports_host_access():
  source = pathlib.Path(terminal.__file__).read_text()
  imports = re.findall(r"^\s*(?:import|from)\s+(\w+)", source, re.M)
  assert not {"os", "subprocess", "shutil", "pathlib", "io", "glob", "sys"} & set(imports)
  assert "open(" not in source


def test_expert_succeeds_on_every_template():
  env = terminal.Terminal()
  successes, templates = 0, set()
  for seed in range(100):
    final = _expert_episode(env, seed)[-1]
    successes += final.info["success"]
    templates.add(env.task.template)
    sub = final.info["sub_outcomes"]
    assert sub["verifiers_passed"] == sub["verifiers_total"] == len(env.task.verifiers)
  assert successes >= 95
  assert templates == set(terminal.TEMPLATES)


def test_random_policy_rarely_succeeds():
  env = terminal.Terminal()
  rng = random.Random(0)
  rate = sum(_random_episode(env, s, rng).info["success"] for s in range(200)) / 200
  assert rate <= RANDOM_SUCCESS_BOUND


def test_verifiers_passed_counts_per_step():
  env = terminal.Terminal(templates=("make_project",))
  env.reset(3)
  root = env.task.solution[0].split()[-2].rsplit("/", 1)[0]  # ".../<name>/src" -> ".../<name>".
  counts = [env.step(line).info["verifiers_passed"]
            for line in (f"mkdir {root}", f"mkdir {root}/src", f"mkdir {root}/tests",
                         f"touch {root}/README.md")]
  assert counts == [1, 2, 3, 4]
  final = env.step("submit")
  assert final.done and final.reward == 1.0 and final.info["success"]


@pytest.mark.parametrize("command", ["ls /nope", "echo -n hi", "cat /data/log.txt", "pwd"])
def test_prompt_starts_its_own_line(command):
  env = terminal.Terminal(max_turns=4)
  env.reset(0)
  observation = env.step(command).observation
  lines = observation.split("\n")
  assert lines[-1] == "/home/user$", observation
  assert len(lines) >= 2 and lines[-2], observation  # The output itself, not an empty line.


def test_step_cap_reports_verifiers():
  env = terminal.Terminal(max_turns=2, templates=("backup",))
  env.reset(0)
  env.step("ls")
  final = env.step("pwd")
  assert final.done and not final.info["success"] and final.reward == 0.0
  assert final.info["sub_outcomes"]["verifiers_total"] == 3
  # Untouched state: only "original_kept" passes.
  assert final.info["sub_outcomes"]["verifiers_passed"] == 1


def test_same_seed_same_episode():
  actions = ["ls /", "cat /data/log.txt", "bogus", "find /", "submit"]

  def play(seed):
    env = terminal.Terminal()
    trace = [env.reset(seed)]
    for a in actions:
      result = env.step(a)
      trace.append(result)
      if result.done:
        break
    return trace, env.fs.snapshot()

  assert play(5) == play(5)
  assert play(5)[0][0] != play(6)[0][0] or play(5)[1] != play(6)[1]


@pytest.mark.parametrize("action, fragment", [
    ("", "empty command"),
    ("   ", "empty command"),
    (None, "action of type NoneType"),
    (42, "action of type int"),
    ("x" * 5000, "longer than 400"),
    ("frobnicate now", "unknown command 'frobnicate'"),
    ("echo 'unclosed", "cannot parse command"),
    ("ls | ", "empty command in pipe"),
    ("ls\nrm -r /data", "one command per turn"),
])
def test_malformed_actions_get_a_clear_observation(action, fragment):
  env = terminal.Terminal()
  env.reset(0)
  result = env.step(action)
  assert fragment in result.observation
  assert result.info["action_valid"] is False and not result.done and result.reward == 0.0
  assert len(result.observation) < 400
