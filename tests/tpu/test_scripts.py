"""Tests for the tpu/ shell scripts: dry-run transcripts, the exact gcloud argv, bad flags.

Real runs use a fake `gcloud` first on PATH that appends its argv as one JSON line to a file
(and answers `describe` as "not found" unless FAKE_GCLOUD_EXISTS=1), so nothing reaches Google
Cloud. The remote command `launch.sh` sends is then run here, under a fake $HOME, to check what
the worker would execute.
"""

import json
import os
import pathlib
import shlex
import subprocess
import sys
import tarfile
import time

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TPU_DIR = REPO_ROOT / "tpu"
SCRIPTS = ("create.sh", "setup.sh", "launch.sh", "logs.sh", "delete.sh", "gpu_launch.sh")

_FAKE_GCLOUD = """#!{python}
import json, os, sys
with open(os.environ["FAKE_GCLOUD_LOG"], "a") as f:
  f.write(json.dumps(sys.argv[1:]) + "\\n")
if "describe" in sys.argv and os.environ.get("FAKE_GCLOUD_EXISTS") != "1":
  sys.exit(1)
"""

# Records its argv and the JAX_* environment, then lingers so the launch sees it running.
_FAKE_PYTHON = """#!{python}
import json, os, sys, time
with open(os.environ["FAKE_PYTHON_LOG"], "a") as f:
  env = {{k: v for k, v in os.environ.items() if k.startswith(("JAX_", "CUDA_"))}}
  f.write(json.dumps({{"argv": sys.argv[1:], "env": env, "cwd": os.getcwd()}}) + "\\n")
print("training...", flush=True)
time.sleep(float(os.environ.get("FAKE_PYTHON_SLEEP", "0")))
"""

V5E = ["--name=agentrl", "--zone=us-west4-a"]
LAUNCH_ARGS = [*V5E, "--gin_file=experiments/configs/quickstart.gin",
               "--workdir=gs://my-bucket/runs/quickstart",
               "--gin_bindings=configs.TrainConfig.num_iterations = 50"]


@pytest.fixture
def fake(tmp_path):
  """An environment whose PATH starts with the fake gcloud; `.calls()` reads what it got."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  gcloud = bin_dir / "gcloud"
  gcloud.write_text(_FAKE_GCLOUD.format(python=sys.executable))
  gcloud.chmod(0o755)
  log = tmp_path / "gcloud_calls.jsonl"
  env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "JAX_"))}
  env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", FAKE_GCLOUD_LOG=str(log),
             TMPDIR=str(tmp_path))

  class Fake:
    environ = env

    @staticmethod
    def calls():
      if not log.exists():
        return []
      return [json.loads(line) for line in log.read_text().splitlines()]

  return Fake


def _run(script, args, env, check=True):
  result = subprocess.run(["bash", str(TPU_DIR / script), *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
  if check:
    assert result.returncode == 0, result.stderr
  return result


def _dry_run_commands(script, args, env):
  """The commands a --dry-run prints, each split back into its argv."""
  out = _run(script, [*args, "--dry-run"], env).stdout
  lines = out.splitlines()
  assert lines and all(line.startswith("+ ") for line in lines), out
  return [shlex.split(line[2:]) for line in lines]


def _option(argv, name):
  values = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
  assert len(values) == 1, f"{name} appears {len(values)} times in {argv}"
  return values[0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_usage(script):
  result = subprocess.run(["bash", str(TPU_DIR / script), "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
  assert result.returncode == 0
  assert "Usage:" in result.stdout and "--dry-run" in result.stdout


@pytest.mark.parametrize("script, args, missing", [
    ("create.sh", ["--zone=z", "--accelerator-type=v5litepod-16"], "--name"),
    ("create.sh", ["--name=n", "--zone=z"], "--accelerator-type"),
    ("setup.sh", ["--name=n"], "--zone"),
    ("launch.sh", ["--name=n", "--zone=z", "--workdir=gs://b/r"], "--gin_file"),
    ("launch.sh", ["--name=n", "--zone=z", "--gin_file=a.gin"], "--workdir"),
    ("logs.sh", ["--zone=z"], "--name"),
    ("delete.sh", ["--name=n"], "--zone"),
    ("gpu_launch.sh", ["--gin_file=a.gin"], "--workdir"),
    ("gpu_launch.sh", ["--gin_file=a.gin", "--workdir=/w", "--num-processes=2",
                       "--process-id=0"], "--coordinator-address"),
])
def test_missing_flag_fails_naming_it(fake, script, args, missing):
  result = _run(script, [*args, "--dry-run"], fake.environ, check=False)
  assert result.returncode == 2
  assert f"missing {missing}" in result.stderr
  assert fake.calls() == []


@pytest.mark.parametrize("script, args, message", [
    ("create.sh", [*V5E, "--accelerator-type=v5litepod-16", "--colour=blue"], "unknown flag --colour"),
    ("create.sh", [*V5E, "--accelerator-type=x9-8"], "no default --runtime-version"),
    ("create.sh", [*V5E, "--accelerator-type"], "--accelerator-type needs a value"),
    ("create.sh", [*V5E, "--accelerator-type=v4-8", "--spot=yes"], "--spot takes no value"),
    ("launch.sh", [*V5E, "--gin_file=a.gin", "--workdir=/local/dir"], "gs:// path"),
    ("launch.sh", [*LAUNCH_ARGS, "--venv=my venv"], "--venv must be a relative path"),
    ("logs.sh", [*V5E, "--worker=all"], "--worker must be a worker number"),
    ("gpu_launch.sh", ["--gin_file=a.gin", "--workdir=/w", "--num-processes=2",
                       "--process-id=2", "--coordinator-address=h:1"], "--process-id must be in"),
    ("gpu_launch.sh", ["--gin_file=a.gin", "--workdir=/w", "--num-processes=2",
                       "--process-id=0", "--coordinator-address=h"], "host:port"),
])
def test_bad_flags_fail_clearly(fake, script, args, message):
  result = _run(script, args, fake.environ, check=False)
  assert result.returncode == 2
  assert message in result.stderr


def test_create_dry_run_prints_the_exact_command(fake):
  lines = _run("create.sh", [*V5E, "--accelerator-type=v5litepod-16", "--spot", "--dry-run"],
               fake.environ).stdout.splitlines()
  assert lines == ["+ gcloud compute tpus tpu-vm create agentrl --zone=us-west4-a "
                   "--accelerator-type=v5litepod-16 --version=v2-alpha-tpuv5-lite --spot"]
  assert fake.calls() == []


def test_create_runs_what_the_dry_run_prints(fake):
  args = [*V5E, "--accelerator-type=v5litepod-16", "--project=my-project"]
  (printed,) = _dry_run_commands("create.sh", args, fake.environ)
  _run("create.sh", args, fake.environ)
  describe, create = fake.calls()
  assert describe[:4] == ["compute", "tpus", "tpu-vm", "describe"]
  assert ["gcloud", *create] == printed
  assert create[:5] == ["compute", "tpus", "tpu-vm", "create", "agentrl"]
  assert _option(create, "--accelerator-type") == "v5litepod-16"
  assert _option(create, "--zone") == "us-west4-a"
  assert _option(create, "--project") == "my-project"
  assert "--spot" not in create


def test_create_leaves_an_existing_tpu_alone(fake):
  fake.environ["FAKE_GCLOUD_EXISTS"] = "1"
  result = _run("create.sh", [*V5E, "--accelerator-type=v5litepod-16"], fake.environ)
  assert "already exists" in result.stderr
  assert [call[3] for call in fake.calls()] == ["describe"]


def test_create_queued_spot_with_explicit_runtime(fake):
  _run("create.sh", [*V5E, "--accelerator-type=v4-32", "--runtime-version=my-image", "--queued",
                     "--spot"], fake.environ)
  describe, create = fake.calls()
  assert describe[:4] == ["compute", "tpus", "queued-resources", "describe"]
  assert create[:5] == ["compute", "tpus", "queued-resources", "create", "agentrl"]
  assert _option(create, "--node-id") == "agentrl"
  assert _option(create, "--runtime-version") == "my-image"
  assert _option(create, "--accelerator-type") == "v4-32"
  assert "--spot" in create


def test_setup_copies_the_checkout_and_installs_on_every_worker(fake, tmp_path):
  _run("setup.sh", V5E, fake.environ)
  scp, unpack, install = fake.calls()
  archive = tmp_path / "agentrl_jax-agentrl.tar.gz"
  assert scp[:4] == ["compute", "tpus", "tpu-vm", "scp"] and str(archive) in scp
  with tarfile.open(archive) as tar:
    names = tar.getnames()
  assert "./experiments/run.py" in names and "./setup.py" in names
  assert not any("/.git/" in n or n.endswith("/.git") for n in names)
  for call in (scp, unpack, install):
    assert "--worker=all" in call and _option(call, "--zone") == "us-west4-a"
  remote = _option(install, "--command")
  assert "pip install --quiet 'jax[tpu]'" in remote
  assert "pip install --quiet -e '.[tpu]'" in remote
  # The images ship Python 3.10; the venv gets uv's 3.11 instead of the system python3.
  assert "uv python install 3.11" in remote
  assert "$(uv python find 3.11) -m venv $HOME/agentrl_venv" in remote
  assert "python3 -m venv" not in remote


@pytest.mark.parametrize("version", ["3.10", "3", "python3.12", "3.11; rm -rf /"])
def test_setup_refuses_a_python_older_than_3_11(fake, version):
  result = _run("setup.sh", [*V5E, f"--python={version}", "--dry-run"], fake.environ, check=False)
  assert result.returncode == 2
  assert "--python must be a version 3.11 or newer" in result.stderr
  assert fake.calls() == []


# A worker's tools for the install command: `uv` (finds the Python below), that Python (makes a
# venv whose python is this test's interpreter, >= 3.11, and whose pip records its argv).
_FAKE_UV = """#!/usr/bin/env bash
echo "uv $*" >> "$FAKE_WORKER_LOG"
if [ "$1 $2" = "python find" ]; then echo "$FAKE_NEW_PYTHON"; fi
"""
_FAKE_NEW_PYTHON = """#!/usr/bin/env bash
echo "new-python $*" >> "$FAKE_WORKER_LOG"
[ "$1 $2" = "-m venv" ] || exit 1
mkdir -p "$3/bin"
ln -sf {python} "$3/bin/python"
printf '#!/usr/bin/env bash\necho "pip $*" >> "$FAKE_WORKER_LOG"\n' > "$3/bin/pip"
chmod +x "$3/bin/pip"
"""


@pytest.mark.parametrize("old_venv", [False, True])
def test_setup_install_command_makes_a_new_python_venv_on_the_worker(fake, tmp_path, old_venv):
  """Runs the install command setup.sh sends on a fake worker home; an existing venv on the
  image's Python 3.10 (a python that fails the version check) is replaced."""
  _run("setup.sh", V5E, fake.environ)
  remote = _option(fake.calls()[-1], "--command")
  home = tmp_path / "worker_home"
  (home / "agentrl_jax").mkdir(parents=True)
  tools = tmp_path / "worker_bin"
  tools.mkdir()
  for name, text in (("uv", _FAKE_UV),
                     ("new_python", _FAKE_NEW_PYTHON.format(python=sys.executable))):
    (tools / name).write_text(text)
    (tools / name).chmod(0o755)
  if old_venv:
    old = home / "agentrl_venv" / "bin" / "python"
    old.parent.mkdir(parents=True)
    old.write_text("#!/usr/bin/env bash\nexit 1\n")  # sys.version_info < (3, 11)
    old.chmod(0o755)
  log = tmp_path / "worker.log"
  env = {**fake.environ, "HOME": str(home), "PATH": f"{tools}{os.pathsep}{fake.environ['PATH']}",
         "FAKE_WORKER_LOG": str(log), "FAKE_NEW_PYTHON": str(tools / "new_python")}
  subprocess.run(["bash", "-c", remote], env=env, capture_output=True, text=True, timeout=60,
                 check=True)
  venv_python = home / "agentrl_venv" / "bin" / "python"
  assert venv_python.resolve() == pathlib.Path(sys.executable).resolve()
  assert log.read_text().splitlines() == [
      "uv python install 3.11", "uv python find 3.11",
      f"new-python -m venv {home}/agentrl_venv",
      "pip install --quiet --upgrade pip", "pip install --quiet jax[tpu]",
      "pip install --quiet -e .[tpu]"]


def test_setup_from_git_clones_the_ref(fake):
  _run("setup.sh", [*V5E, "--repo=https://example.com/agentrl_jax.git", "--ref=v0.1"],
       fake.environ)
  clone, install = fake.calls()
  remote = _option(clone, "--command")
  assert "git clone --quiet https://example.com/agentrl_jax.git $HOME/agentrl_jax" in remote
  assert "fetch --quiet origin v0.1" in remote
  assert "--worker=all" in clone and "--worker=all" in install


def test_launch_starts_run_py_with_the_gin_file_and_workdir_on_all_workers(fake):
  (printed,) = _dry_run_commands("launch.sh", LAUNCH_ARGS, fake.environ)
  _run("launch.sh", LAUNCH_ARGS, fake.environ)
  (ssh,) = fake.calls()
  assert ["gcloud", *ssh] == printed
  assert ssh[:5] == ["compute", "tpus", "tpu-vm", "ssh", "agentrl"]
  assert "--worker=all" in ssh and _option(ssh, "--zone") == "us-west4-a"
  remote = _option(ssh, "--command")
  assert ("nohup $HOME/agentrl_venv/bin/python experiments/run.py "
          "--gin_file=experiments/configs/quickstart.gin "
          "--workdir=gs://my-bucket/runs/quickstart "
          "'--gin_bindings=configs.TrainConfig.num_iterations = 50' "
          "> $HOME/agentrl_logs/run.log 2>&1") in remote


def test_launch_remote_command_runs_once_per_worker(fake, tmp_path):
  """Runs the command launch.sh sends on a fake worker home: one job, its log, and no second."""
  _run("launch.sh", LAUNCH_ARGS, fake.environ)
  remote = _option(fake.calls()[0], "--command")
  home = tmp_path / "worker_home"
  (home / "agentrl_jax").mkdir(parents=True)
  python = home / "agentrl_venv" / "bin" / "python"
  python.parent.mkdir(parents=True)
  python.write_text(_FAKE_PYTHON.format(python=sys.executable))
  python.chmod(0o755)
  record = tmp_path / "python_calls.jsonl"
  env = {**fake.environ, "HOME": str(home), "FAKE_PYTHON_LOG": str(record),
         "FAKE_PYTHON_SLEEP": "30"}
  first = subprocess.run(["bash", "-c", remote], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
  assert "started pid" in first.stdout
  pid = int((home / "agentrl_logs" / "run.log.pid").read_text())
  try:
    second = subprocess.run(["bash", "-c", remote], env=env, capture_output=True, text=True,
                            timeout=60, check=True)
    assert "already running" in second.stdout
    deadline = time.time() + 30
    while not record.exists() and time.time() < deadline:
      time.sleep(0.1)
    (call,) = [json.loads(line) for line in record.read_text().splitlines()]
  finally:
    os.kill(pid, 15)
  assert call["argv"] == ["experiments/run.py", "--gin_file=experiments/configs/quickstart.gin",
                          "--workdir=gs://my-bucket/runs/quickstart",
                          "--gin_bindings=configs.TrainConfig.num_iterations = 50"]
  assert call["cwd"] == str(home / "agentrl_jax")


def test_logs_tails_one_worker(fake):
  _run("logs.sh", [*V5E, "--worker=2", "--lines=20"], fake.environ)
  (ssh,) = fake.calls()
  assert "--worker=2" in ssh
  assert _option(ssh, "--command") == "tail -n 20 -F $HOME/agentrl_logs/run.log"


def test_delete_only_what_exists(fake):
  _run("delete.sh", V5E, fake.environ)
  assert [call[3] for call in fake.calls()] == ["describe"]
  fake.environ["FAKE_GCLOUD_EXISTS"] = "1"
  _run("delete.sh", [*V5E, "--queued"], fake.environ)
  delete = fake.calls()[-1]
  assert delete[:5] == ["compute", "tpus", "queued-resources", "delete", "agentrl"]
  assert "--force" in delete and "--quiet" in delete


def _fake_python(tmp_path):
  python = tmp_path / "python"
  python.write_text(_FAKE_PYTHON.format(python=sys.executable))
  python.chmod(0o755)
  return python


def test_gpu_launch_multi_node_passes_the_coordinator(fake, tmp_path):
  python = _fake_python(tmp_path)
  record = tmp_path / "python_calls.jsonl"
  env = {**fake.environ, "FAKE_PYTHON_LOG": str(record), "JAX_COORDINATOR_ADDRESS": "10.0.0.1:8476",
         "JAX_NUM_PROCESSES": "2"}
  args = [f"--python={python}", "--gin_file=experiments/configs/quickstart.gin",
          f"--workdir={tmp_path / 'run'}", "--process-id=1", "--gpus=0,1", "--foreground"]
  (printed,) = _dry_run_commands("gpu_launch.sh", args, env)
  _run("gpu_launch.sh", args, env)
  (call,) = [json.loads(line) for line in record.read_text().splitlines()]
  assert printed[0] == "env" and printed[-len(call["argv"]):] == call["argv"]
  assert call["env"] == {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:8476", "JAX_NUM_PROCESSES": "2",
                         "JAX_PROCESS_ID": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
  assert call["argv"] == [str(REPO_ROOT / "experiments" / "run.py"),
                          "--gin_file=experiments/configs/quickstart.gin",
                          f"--workdir={tmp_path / 'run'}"]


def test_gpu_launch_single_host_in_the_background_with_a_log(fake, tmp_path):
  python = _fake_python(tmp_path)
  record = tmp_path / "python_calls.jsonl"
  env = {**fake.environ, "FAKE_PYTHON_LOG": str(record)}
  workdir = tmp_path / "runs" / "q"
  args = [f"--python={python}", "--gin_file=a.gin", f"--workdir={workdir}"]
  dry = _run("gpu_launch.sh", [*args, "--dry-run"], env).stdout
  assert dry == (f"+ nohup env {python} {REPO_ROOT}/experiments/run.py --gin_file=a.gin "
                 f"--workdir={workdir} > {workdir}.log 2>&1 < /dev/null &\n")
  assert "started pid" in _run("gpu_launch.sh", args, env).stdout
  deadline = time.time() + 30
  while not (record.exists() and "training" in pathlib.Path(f"{workdir}.log").read_text()):
    assert time.time() < deadline, "the background job never started"
    time.sleep(0.1)
  (call,) = [json.loads(line) for line in record.read_text().splitlines()]
  assert call["env"] == {}
  assert call["argv"][1:] == ["--gin_file=a.gin", f"--workdir={workdir}"]
