"""Terminal: shell tasks in a sandboxed, in-memory filesystem.

The policy types shell commands; a small interpreter written here runs them against a filesystem
that lives in a Python dict. Nothing touches the host: there is no `os`, `subprocess` or file I/O
in this module, and path resolution clamps `..` at the sandbox root, so `cat ../../etc/passwd`
reads the sandbox's own `/etc/passwd` (which does not exist).

Supported: `ls cd pwd cat echo mkdir touch rm mv cp grep wc head find`, output redirection
(`> file`, `>> file`) on any command, one-level pipes (`cmd | cmd`), `*`/`?` globs in the last
path component, and `submit` (or `exit`) to end the episode.

Each task (drawn from a template by the reset seed) comes with verifiers over the final
filesystem state. `info["verifiers_passed"]` is reported every step, so a dense reward (count of
passing verifiers, docs/methods.md#t1) can be shaped from it; the final step's `sub_outcomes`
carry `verifiers_passed` and `verifiers_total`. The outcome reward is 1 when every verifier
passes at the end of the episode, else 0.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import shlex
from typing import Any, Callable

import numpy as np

from agentrl_jax.envs import base
from agentrl_jax.envs import registry

COMMANDS = ("ls", "cd", "pwd", "cat", "echo", "mkdir", "touch", "rm", "mv", "cp", "grep", "wc",
            "head", "find")
END_COMMANDS = ("submit", "exit")
# Longer lines are refused unparsed: no real solution needs them and they would only bloat the log.
MAX_COMMAND_CHARS = 400
# Output beyond this many characters is cut, so a `cat` of a big file cannot flood the context.
MAX_OUTPUT_CHARS = 300
_QUOTE_CHARS = 16
_HOME = "/home/user"
_HELP = "commands: " + " ".join(COMMANDS) + "; submit when done"

# ---------------------------------------------------------------------------------------------
# Paths and the filesystem.


def resolve(cwd: str, path: str) -> str:
  """Absolute, normalised sandbox path of `path` seen from `cwd`; `..` stops at the root."""
  parts = [] if path.startswith("/") else [p for p in cwd.split("/") if p]
  for part in path.split("/"):
    if part in ("", "."):
      continue
    if part == "..":
      if parts:
        parts.pop()
      continue
    parts.append(part)
  return "/" + "/".join(parts)


def _parent(path: str) -> str:
  return resolve(path, "..")


def _basename(path: str) -> str:
  return path.rstrip("/").rsplit("/", 1)[-1]


class FileSystem:
  """Directories and text files in memory, keyed by absolute path."""

  def __init__(self):
    self.dirs: set[str] = {"/"}
    self.files: dict[str, str] = {}

  def copy(self) -> "FileSystem":
    fs = FileSystem()
    fs.dirs = set(self.dirs)
    fs.files = dict(self.files)
    return fs

  def snapshot(self) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    return tuple(sorted(self.dirs)), tuple(sorted(self.files.items()))

  def is_dir(self, path: str) -> bool:
    return path in self.dirs

  def is_file(self, path: str) -> bool:
    return path in self.files

  def exists(self, path: str) -> bool:
    return path in self.dirs or path in self.files

  def children(self, path: str) -> list[str]:
    """Sorted absolute paths directly inside directory `path`."""
    prefix = path.rstrip("/") + "/"
    entries = [p for p in (*self.dirs, *self.files)
               if p != "/" and p.startswith(prefix) and "/" not in p[len(prefix):]]
    return sorted(entries)

  def walk(self, path: str) -> list[str]:
    """`path` and everything below it, sorted."""
    prefix = path.rstrip("/") + "/"
    return sorted(p for p in (*self.dirs, *self.files) if p == path or p.startswith(prefix))

  def make_dirs(self, path: str) -> None:
    while path not in self.dirs:
      self.dirs.add(path)
      path = _parent(path)

  def write(self, path: str, text: str) -> None:
    self.make_dirs(_parent(path))
    self.files[path] = text

  def remove_tree(self, path: str) -> None:
    for p in self.walk(path):
      self.dirs.discard(p)
      self.files.pop(p, None)


class ShellError(Exception):
  """A command failed; the message is shown to the policy like stderr."""


class _Malformed(Exception):
  """The line is not a command at all (unknown program, bad quoting): an invalid action."""


# ---------------------------------------------------------------------------------------------
# The interpreter.


class Shell:
  """Runs command lines against a `FileSystem`; keeps the working directory."""

  def __init__(self, fs: FileSystem, cwd: str = "/"):
    self.fs = fs
    self.cwd = cwd

  def run(self, line: str) -> str:
    """Runs one command line and returns its output (stdout or the error message).

    Raises:
      _Malformed: the line is not a command this shell knows.
    """
    try:
      tokens = shlex.split(line, comments=False, posix=True)
    except ValueError as e:
      raise _Malformed(f"cannot parse command: {e}") from None
    stages = _split_pipes(tokens)
    for stage in stages:
      if not stage:
        raise _Malformed("empty command in pipe")
      if stage[0] not in COMMANDS:
        raise _Malformed(f"unknown command '{_quote(stage[0])}'")
    *head, last = stages
    last, redirect = _split_redirect(last)
    stdin = None
    try:
      for stage in head:
        stdin = self._exec(stage, stdin)
      out = self._exec(last, stdin)
      if redirect is not None:
        mode, target = redirect
        self._redirect(out, mode, target)
        out = ""
    except ShellError as e:
      return str(e)
    return out

  def _exec(self, argv: list[str], stdin: str | None) -> str:
    name, args = argv[0], argv[1:]
    return getattr(self, f"_cmd_{name}")(args, stdin)

  def _redirect(self, text: str, mode: str, target: str) -> None:
    path = self._path(target)
    if self.fs.is_dir(path):
      raise ShellError(f"{target}: is a directory")
    if not self.fs.is_dir(_parent(path)):
      raise ShellError(f"{target}: no such file or directory")
    previous = self.fs.files.get(path, "") if mode == ">>" else ""
    self.fs.files[path] = previous + text

  def _path(self, arg: str) -> str:
    return resolve(self.cwd, arg)

  def _expand(self, args: list[str]) -> list[str]:
    """Absolute paths of `args`, with globs in the last component matched against the fs."""
    paths = []
    for arg in args:
      base_name = _basename(arg)
      if any(c in base_name for c in "*?["):
        directory = self._path(arg[: len(arg) - len(base_name)] or ".")
        matches = [p for p in self.fs.children(directory)
                   if fnmatch.fnmatchcase(_basename(p), base_name)]
        if not matches:
          raise ShellError(f"{arg}: no such file or directory")
        paths.extend(matches)
      else:
        paths.append(self._path(arg))
    return paths

  def _read(self, path: str, shown: str) -> str:
    if self.fs.is_dir(path):
      raise ShellError(f"{shown}: is a directory")
    if not self.fs.is_file(path):
      raise ShellError(f"{shown}: no such file or directory")
    return self.fs.files[path]

  def _inputs(self, args: list[str], stdin: str | None, name: str) -> list[tuple[str, str]]:
    """(label, text) of each file argument, or of stdin when there is none."""
    if not args:
      if stdin is None:
        raise ShellError(f"{name}: missing file operand")
      return [("", stdin)]
    return [(p, self._read(p, p)) for p in self._expand(args)]

  # Each `_cmd_<name>(args, stdin) -> stdout` raises ShellError with the message to show.

  def _cmd_pwd(self, args, stdin):
    del args, stdin
    return self.cwd + "\n"

  def _cmd_cd(self, args, stdin):
    del stdin
    path = self._path(args[0]) if args else _HOME
    if not self.fs.is_dir(path):
      raise ShellError(f"cd: {args[0] if args else path}: no such directory")
    self.cwd = path
    return ""

  def _cmd_ls(self, args, stdin):
    del stdin
    args = [a for a in args if not a.startswith("-")]
    paths = self._expand(args) if args else [self.cwd]
    lines = []
    for path in paths:
      if self.fs.is_dir(path):
        names = [_basename(p) + ("/" if self.fs.is_dir(p) else "") for p in self.fs.children(path)]
        lines.append(" ".join(names))
      elif self.fs.is_file(path):
        lines.append(_basename(path))
      else:
        raise ShellError(f"ls: {path}: no such file or directory")
    return "\n".join(lines) + "\n" if any(lines) else ""

  def _cmd_cat(self, args, stdin):
    return "".join(text for _, text in self._inputs(args, stdin, "cat"))

  def _cmd_echo(self, args, stdin):
    del stdin
    if args and args[0] == "-n":
      return " ".join(args[1:])
    return " ".join(args) + "\n"

  def _cmd_mkdir(self, args, stdin):
    del stdin
    parents = "-p" in args
    targets = [a for a in args if not a.startswith("-")]
    if not targets:
      raise ShellError("mkdir: missing operand")
    for arg in targets:
      path = self._path(arg)
      if self.fs.exists(path):
        if parents and self.fs.is_dir(path):
          continue
        raise ShellError(f"mkdir: {arg}: file exists")
      if not parents and not self.fs.is_dir(_parent(path)):
        raise ShellError(f"mkdir: {arg}: no such file or directory")
      self.fs.make_dirs(path)
    return ""

  def _cmd_touch(self, args, stdin):
    del stdin
    if not args:
      raise ShellError("touch: missing file operand")
    for arg in args:
      path = self._path(arg)
      if self.fs.exists(path):
        continue
      if not self.fs.is_dir(_parent(path)):
        raise ShellError(f"touch: {arg}: no such file or directory")
      self.fs.files[path] = ""
    return ""

  def _cmd_rm(self, args, stdin):
    del stdin
    recursive = any(a in ("-r", "-rf", "-fr", "-R") for a in args)
    targets = [a for a in args if not a.startswith("-")]
    if not targets:
      raise ShellError("rm: missing operand")
    for path in self._expand(targets):
      if path == "/":
        raise ShellError("rm: refusing to remove '/'")
      if self.fs.is_dir(path):
        if not recursive:
          raise ShellError(f"rm: {path}: is a directory (use rm -r)")
        self.fs.remove_tree(path)
        if self.cwd == path or self.cwd.startswith(path + "/"):
          self.cwd = _parent(path)
      elif self.fs.is_file(path):
        del self.fs.files[path]
      else:
        raise ShellError(f"rm: {path}: no such file or directory")
    return ""

  def _transfer(self, args: list[str], name: str, move: bool) -> str:
    recursive = any(a in ("-r", "-R") for a in args)
    operands = [a for a in args if not a.startswith("-")]
    if len(operands) < 2:
      raise ShellError(f"{name}: missing destination operand")
    sources = self._expand(operands[:-1])
    dest = self._path(operands[-1])
    if len(sources) > 1 and not self.fs.is_dir(dest):
      raise ShellError(f"{name}: target {operands[-1]} is not a directory")
    for src in sources:
      if not self.fs.exists(src):
        raise ShellError(f"{name}: {src}: no such file or directory")
      if src == "/":
        raise ShellError(f"{name}: refusing to {name} '/'")
      target = dest + "/" + _basename(src) if self.fs.is_dir(dest) else dest
      target = resolve("/", target)
      if not self.fs.is_dir(_parent(target)):
        raise ShellError(f"{name}: {operands[-1]}: no such file or directory")
      if target == src:
        raise ShellError(f"{name}: {src} and {target} are the same file")
      if self.fs.is_dir(src):
        if not (move or recursive):
          raise ShellError(f"{name}: {src} is a directory (use cp -r)")
        if target.startswith(src + "/"):
          raise ShellError(f"{name}: cannot copy {src} into itself")
        for p in self.fs.walk(src):
          q = target + p[len(src):]
          if self.fs.is_dir(p):
            self.fs.make_dirs(q)
          else:
            self.fs.files[q] = self.fs.files[p]
      else:
        self.fs.files[target] = self.fs.files[src]
      if move:
        self.fs.remove_tree(src)
    return ""

  def _cmd_cp(self, args, stdin):
    del stdin
    return self._transfer(args, "cp", move=False)

  def _cmd_mv(self, args, stdin):
    del stdin
    return self._transfer(args, "mv", move=True)

  def _cmd_grep(self, args, stdin):
    flags = {a for a in args if a.startswith("-") and len(a) > 1}
    operands = [a for a in args if a not in flags]
    if not operands:
      raise ShellError("grep: missing pattern")
    pattern, files = operands[0], operands[1:]
    ignore_case, invert, count = "-i" in flags, "-v" in flags, "-c" in flags
    needle = pattern.lower() if ignore_case else pattern
    out = []
    inputs = self._inputs(files, stdin, "grep")
    for label, text in inputs:
      hits = [line for line in text.splitlines()
              if ((needle in (line.lower() if ignore_case else line)) != invert)]
      prefix = f"{label}:" if len(inputs) > 1 else ""
      if count:
        out.append(f"{prefix}{len(hits)}")
      else:
        out.extend(prefix + line for line in hits)
    return "\n".join(out) + "\n" if out else ""

  def _cmd_wc(self, args, stdin):
    flags = {a for a in args if a.startswith("-")}
    files = [a for a in args if a not in flags]
    out = []
    for label, text in self._inputs(files, stdin, "wc"):
      counts = {"-l": text.count("\n"), "-w": len(text.split()), "-c": len(text)}
      chosen = [str(counts[f]) for f in ("-l", "-w", "-c") if f in flags] or [
          str(counts[f]) for f in ("-l", "-w", "-c")]
      out.append(" ".join(chosen + ([label] if label else [])))
    return "\n".join(out) + "\n"

  def _cmd_head(self, args, stdin):
    n, files, i = 10, [], 0
    while i < len(args):
      if args[i] == "-n" and i + 1 < len(args):
        n, i = _parse_count(args[i + 1]), i + 2
      elif args[i].startswith("-") and args[i][1:].isdigit():
        n, i = int(args[i][1:]), i + 1
      else:
        files.append(args[i])
        i += 1
    return "".join("".join(text.splitlines(keepends=True)[:n])
                   for _, text in self._inputs(files, stdin, "head"))

  def _cmd_find(self, args, stdin):
    del stdin
    root, pattern, kind, i = None, None, None, 0
    while i < len(args):
      if args[i] == "-name" and i + 1 < len(args):
        pattern, i = args[i + 1], i + 2
      elif args[i] == "-type" and i + 1 < len(args):
        kind, i = args[i + 1], i + 2
      elif root is None and not args[i].startswith("-"):
        root, i = args[i], i + 1
      else:
        raise ShellError(f"find: unknown argument {_quote(args[i])}")
    start = self._path(root or ".")
    if not self.fs.exists(start):
      raise ShellError(f"find: {root}: no such file or directory")
    hits = [p for p in self.fs.walk(start)
            if (pattern is None or fnmatch.fnmatchcase(_basename(p), pattern))
            and (kind is None or (kind == "d") == self.fs.is_dir(p))]
    return "\n".join(hits) + "\n" if hits else ""


def _parse_count(text: str) -> int:
  if not text.isdigit():
    raise ShellError(f"head: invalid number of lines: {_quote(text)}")
  return int(text)


def _split_pipes(tokens: list[str]) -> list[list[str]]:
  stages: list[list[str]] = [[]]
  for token in tokens:
    if token == "|":
      stages.append([])
    else:
      stages[-1].append(token)
  return stages


def _split_redirect(argv: list[str]) -> tuple[list[str], tuple[str, str] | None]:
  """Splits `cmd args > file` into (`cmd args`, ('>', 'file')); also handles `>file`."""
  for i, token in enumerate(argv):
    for mode in (">>", ">"):
      if token == mode:
        if i + 1 != len(argv) - 1:
          raise _Malformed(f"'{mode}' needs exactly one file name after it")
        return argv[:i], (mode, argv[i + 1])
      if token.startswith(mode) and len(token) > len(mode) and i == len(argv) - 1:
        return argv[:i], (mode, token[len(mode):])
  return argv, None


def _quote(text: str) -> str:
  return base.quote_action(text, _QUOTE_CHARS)


# ---------------------------------------------------------------------------------------------
# Tasks.


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Task:
  """One drawn task: its instruction, start state, verifiers and a scripted solution.

  Attributes:
    template: template name.
    instruction: the task text shown to the policy.
    fs: the start filesystem (copied on reset).
    verifiers: (name, check(final fs)) pairs; success means every check passes.
    solution: the expert's command lines, ending with `submit`.
  """

  template: str
  instruction: str
  fs: FileSystem
  verifiers: tuple[tuple[str, Callable[[FileSystem], bool]], ...]
  solution: tuple[str, ...]


_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "lambda", "theta", "zeta")
_LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")


def _log_lines(rng: np.random.Generator, n: int) -> list[str]:
  return [f"{rng.choice(_LEVELS)} {rng.choice(_WORDS)} {int(rng.integers(1000))}" for _ in range(n)]


def _names(rng: np.random.Generator, n: int) -> list[str]:
  return [str(w) for w in rng.choice(_WORDS, size=n, replace=False)]


def _task_count_lines(rng: np.random.Generator) -> Task:
  fs = FileSystem()
  fs.make_dirs(_HOME)
  lines = _log_lines(rng, int(rng.integers(3, 13)))
  log = "\n".join(lines) + "\n"
  fs.write("/data/log.txt", log)
  fs.write("/data/notes.md", "keep me\n")
  n = len(lines)

  def report_is_count(f):
    words = f.files.get("/data/report.txt", "").split()
    return bool(words) and words[0] == str(n)

  return Task(
      template="count_lines",
      instruction="create a file report.txt in /data containing the number of lines of "
                  "/data/log.txt",
      fs=fs,
      verifiers=(("report_exists", lambda f: f.is_file("/data/report.txt")),
                 ("report_is_line_count", report_is_count),
                 ("log_unchanged", lambda f: f.files.get("/data/log.txt") == log)),
      solution=("cd /data", "cat log.txt | wc -l > report.txt", "cat report.txt", "submit"),
  )


def _task_archive_csv(rng: np.random.Generator) -> Task:
  fs = FileSystem()
  fs.make_dirs(_HOME)
  names = _names(rng, 5)
  k = int(rng.integers(2, 4))
  csvs = {f"/data/{name}.csv": f"id,value\n1,{int(rng.integers(100))}\n" for name in names[:k]}
  others = {f"/data/{name}.txt": f"{name}\n" for name in names[k:]}
  for path, text in {**csvs, **others}.items():
    fs.write(path, text)
  moved = {"/archive/" + _basename(p): text for p, text in csvs.items()}
  return Task(
      template="archive_csv",
      instruction="move all .csv files from /data into a new directory /archive",
      fs=fs,
      verifiers=(("archive_is_dir", lambda f: f.is_dir("/archive")),
                 ("csvs_in_archive", lambda f: all(f.files.get(p) == t for p, t in moved.items())),
                 ("no_csv_left", lambda f: not any(p in f.files for p in csvs)),
                 ("others_kept", lambda f: all(f.files.get(p) == t for p, t in others.items()))),
      solution=("mkdir /archive", "mv /data/*.csv /archive", "ls /archive", "submit"),
  )


def _task_grep_errors(rng: np.random.Generator) -> Task:
  fs = FileSystem()
  fs.make_dirs(_HOME)
  fs.make_dirs("/tmp")
  lines = _log_lines(rng, int(rng.integers(4, 12)))
  lines[int(rng.integers(len(lines)))] = f"ERROR {_WORDS[int(rng.integers(10))]} 0"
  log = "\n".join(lines) + "\n"
  fs.write("/var/log/app.log", log)
  errors = [line for line in lines if "ERROR" in line]

  def has_exactly_errors(f):
    return f.files.get("/tmp/errors.txt", "").splitlines() == errors

  return Task(
      template="grep_errors",
      instruction="write the lines of /var/log/app.log that contain ERROR into /tmp/errors.txt",
      fs=fs,
      verifiers=(("errors_file_exists", lambda f: f.is_file("/tmp/errors.txt")),
                 ("errors_file_exact", has_exactly_errors),
                 ("log_unchanged", lambda f: f.files.get("/var/log/app.log") == log)),
      solution=("grep ERROR /var/log/app.log > /tmp/errors.txt", "cat /tmp/errors.txt", "submit"),
  )


def _task_make_project(rng: np.random.Generator) -> Task:
  fs = FileSystem()
  fs.make_dirs(_HOME)
  name = _names(rng, 1)[0]
  root = f"{_HOME}/{name}"
  return Task(
      template="make_project",
      instruction=f"create directory {root} with subdirectories src and tests, and an empty file "
                  f"README.md in {root}",
      fs=fs,
      verifiers=(("root_is_dir", lambda f: f.is_dir(root)),
                 ("src_is_dir", lambda f: f.is_dir(root + "/src")),
                 ("tests_is_dir", lambda f: f.is_dir(root + "/tests")),
                 ("readme_empty", lambda f: f.files.get(root + "/README.md") == "")),
      solution=(f"mkdir -p {root}/src {root}/tests", f"touch {root}/README.md", f"ls {root}",
                "submit"),
  )


def _task_backup(rng: np.random.Generator) -> Task:
  fs = FileSystem()
  fs.make_dirs(_HOME)
  name = _names(rng, 1)[0]
  conf = f"name={name}\nport={int(rng.integers(1000, 9999))}\n"
  src, dst = f"/etc/{name}.conf", f"/backup/{name}.conf.bak"
  fs.write(src, conf)
  return Task(
      template="backup",
      instruction=f"copy {src} to {dst} (create /backup if needed), keeping the original",
      fs=fs,
      verifiers=(("backup_exists", lambda f: f.is_file(dst)),
                 ("backup_matches", lambda f: f.files.get(dst) == conf),
                 ("original_kept", lambda f: f.files.get(src) == conf)),
      solution=("mkdir -p /backup", f"cp {src} {dst}", "ls /backup", "submit"),
  )


def _task_cleanup_tmp(rng: np.random.Generator) -> Task:
  fs = FileSystem()
  fs.make_dirs(_HOME)
  names = _names(rng, 6)
  dirs = ["/work", "/work/cache"]
  temps = [f"{dirs[i % 2]}/{names[i]}.tmp" for i in range(int(rng.integers(2, 4)))]
  keeps = [f"{dirs[i % 2]}/{names[5 - i]}.txt" for i in range(2)]
  for path in temps:
    fs.write(path, "scratch\n")
  for path in keeps:
    fs.write(path, "data\n")
  solution = tuple(f"rm {d}/*.tmp" for d in dirs if any(_parent(t) == d for t in temps))
  return Task(
      template="cleanup_tmp",
      instruction="delete every .tmp file under /work, including subdirectories; keep all other "
                  "files",
      fs=fs,
      verifiers=(("no_tmp_left", lambda f: not any(p.endswith(".tmp") for p in f.files)),
                 ("other_files_kept", lambda f: all(f.is_file(p) for p in keeps)),
                 ("dirs_kept", lambda f: all(f.is_dir(d) for d in dirs))),
      solution=("find /work -name *.tmp",) + solution + ("submit",),
  )


TEMPLATES: dict[str, Callable[[np.random.Generator], Task]] = {
    "count_lines": _task_count_lines,
    "archive_csv": _task_archive_csv,
    "grep_errors": _task_grep_errors,
    "make_project": _task_make_project,
    "backup": _task_backup,
    "cleanup_tmp": _task_cleanup_tmp,
}


# ---------------------------------------------------------------------------------------------
# The environment.


@registry.register("terminal")
class Terminal(base.TextEnv):
  """Shell tasks in an in-memory sandbox (see the module docstring).

  Info every step: `action_valid`, `verifiers_passed`. Final step: `success` (all verifiers pass),
  `sub_outcomes = {"verifiers_passed", "verifiers_total", <verifier name>: 0/1, ...}`.
  """

  def __init__(self, max_turns: int = 12, templates: tuple[str, ...] | None = None):
    """Builds the env.

    Args:
      max_turns: step cap, >= 1.
      templates: task templates to draw from (names in `TEMPLATES`); None = all.
    """
    super().__init__(max_turns=max_turns)
    templates = tuple(TEMPLATES) if templates is None else tuple(templates)
    unknown = [t for t in templates if t not in TEMPLATES]
    if not templates or unknown:
      raise ValueError(f"templates must be a non-empty subset of {sorted(TEMPLATES)}, "
                       f"got {templates!r}")
    self.templates = templates
    self.task: Task | None = None
    self.shell: Shell | None = None
    self._expert_step = 0

  @property
  def fs(self) -> FileSystem:
    """The current sandbox filesystem."""
    return self.shell.fs

  def verifier_results(self) -> dict[str, bool]:
    """Name → whether it passes on the current filesystem."""
    return {name: bool(check(self.fs)) for name, check in self.task.verifiers}

  def expert_action(self) -> str:
    """The task's scripted solution, one line per turn."""
    solution = self.task.solution
    return solution[min(self._expert_step, len(solution) - 1)]

  def _reset(self, seed: int) -> str:
    rng = np.random.default_rng(seed)
    template = self.templates[int(rng.integers(len(self.templates)))]
    self.task = TEMPLATES[template](rng)
    self.shell = Shell(self.task.fs.copy(), cwd=_HOME)
    self._expert_step = 0
    return f"task: {self.task.instruction}\n{_HELP}\n{self._prompt()}"

  def _step(self, action: Any) -> base.StepResult:
    self._expert_step += 1
    problem = _malformed_reason(action)
    if problem is None:
      line = action.strip()
      if line.split()[0] in END_COMMANDS:
        return self._final("submitted", action_valid=True)
      try:
        output = self.shell.run(line)
      except _Malformed as e:
        problem = str(e)
    if problem is not None:
      observation = f"invalid action: {problem}; {_HELP}\n{self._prompt()}"
      return self._result(observation, action_valid=False)
    return self._result(_on_own_lines(_clip(output)) + self._prompt(), action_valid=True)

  def _on_step_cap(self, result: base.StepResult) -> base.StepResult:
    final = self._final(f"{result.observation}\nstep limit reached",
                        action_valid=result.info["action_valid"])
    return final

  def _result(self, observation: str, *, action_valid: bool) -> base.StepResult:
    passed = sum(self.verifier_results().values())
    info = {"action_valid": action_valid, "verifiers_passed": passed}
    return base.StepResult(observation, 0.0, False, info)

  def _final(self, observation: str, *, action_valid: bool) -> base.StepResult:
    results = self.verifier_results()
    passed, total = sum(results.values()), len(results)
    success = passed == total
    sub_outcomes = {"verifiers_passed": float(passed), "verifiers_total": float(total)}
    sub_outcomes.update({name: float(ok) for name, ok in results.items()})
    info = {"action_valid": action_valid, "verifiers_passed": passed, "success": success,
            "sub_outcomes": sub_outcomes}
    observation = f"{observation}: {passed}/{total} checks pass"
    return base.StepResult(observation, float(success), True, info)

  def _prompt(self) -> str:
    return f"{self.shell.cwd}$"


def _malformed_reason(action: Any) -> str | None:
  if not isinstance(action, str):
    return f"action of type {type(action).__name__}, expected a command line"
  line = action.strip()
  if not line:
    return "empty command"
  if len(line) > MAX_COMMAND_CHARS:
    return f"command of {len(line)} characters is longer than {MAX_COMMAND_CHARS}"
  if "\n" in line:
    return "one command per turn (no newlines)"
  return None


def _on_own_lines(output: str) -> str:
  # Error messages (and `echo -n`) carry no final newline; glued to the prompt they read as one
  # line ("...: no such file or directory/home/user$"), which a model then copies as a command.
  return output if not output or output.endswith("\n") else output + "\n"


def _clip(output: str) -> str:
  if len(output) > MAX_OUTPUT_CHARS:
    output = output[:MAX_OUTPUT_CHARS] + f"... ({len(output) - MAX_OUTPUT_CHARS} more chars)\n"
  return output
