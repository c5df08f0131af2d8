"""Fault-isolated env stepping: a pool that steps many envs at once with a per-step timeout.

An env that raises, hangs past the timeout, or returns something that is not a `StepResult`
with a string observation produces a `StepFault` for its own row; the batch goes on. The rollout
loop turns a fault into `env_error` for that trajectory (counted, excluded from the loss).

Two kinds of pool:
  * threads: suit envs that release the GIL or wait on I/O (a Java engine, SQLite, a sleep); a
    hung thread cannot be killed, so it is abandoned and its env is never stepped again.
  * processes (`ProcessPool`): for envs that hold the GIL or may crash the interpreter. Each
    worker process owns its envs, built there from a picklable (factory, kwargs); the caller
    holds `RemoteEnv` handles. A worker whose step hangs is killed; the hung env's trajectory
    ends with a 'timeout' fault, and the worker's other envs are rebuilt in a fresh worker by
    replaying their seed and actions (envs must be deterministic given both, as the contract
    already asks), so they play on.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import multiprocessing
import multiprocessing.connection
import numbers
import time
from typing import Any, Callable, Sequence

from agentrl_jax import config_errors
from agentrl_jax.envs import base as envs_base


@dataclasses.dataclass(frozen=True)
class StepFault:
  """Why an env step failed: 'exception', 'timeout' or 'garbage', with a one-line detail."""

  kind: str
  detail: str


def checked_result(result: Any) -> envs_base.StepResult | StepFault:
  """Accepts a well-formed step result, or names what is wrong with it."""
  if not isinstance(result, tuple) or len(result) != 4:
    return StepFault("garbage", f"step returned {type(result).__name__}, not a StepResult")
  observation, reward, done, info = result
  if not isinstance(observation, str):
    return StepFault("garbage", f"observation is a {type(observation).__name__}, not a str")
  if not isinstance(reward, numbers.Real) or reward != reward:
    return StepFault("garbage", f"reward {reward!r} is not a finite number")
  if not isinstance(info, dict):
    return StepFault("garbage", f"info is a {type(info).__name__}, not a dict")
  return envs_base.StepResult(observation, float(reward), bool(done), info)


def _safe_step(env, action: str) -> envs_base.StepResult | StepFault:
  try:
    return checked_result(env.step(action))
  except Exception as e:  # pylint: disable=broad-except
    return StepFault("exception", f"{type(e).__name__}: {e}")


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
  """How envs are stepped.

  Attributes:
    kind: 'thread' (envs live in this process) or 'process' (envs live in worker processes;
      build them with `EnvStepper.make_env`).
    num_threads: 'thread' only: 0 steps envs one after another in the caller's thread (no
      timeout is possible); > 0 steps them concurrently in that many threads.
    num_processes: 'process' only: worker processes; env i lives in worker i mod num_processes.
    step_timeout_s: a step slower than this is a 'timeout' fault (threads and processes).
    startup_timeout_s: 'process' only: how long a new worker may take to start.
  """

  kind: str = "thread"
  num_threads: int = 0
  num_processes: int = 2
  step_timeout_s: float = 30.0
  startup_timeout_s: float = 120.0

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.kind not in ("thread", "process"):
      raise ValueError(f"WorkerConfig.kind must be 'thread' or 'process', got {self.kind!r}")
    if self.num_threads < 0:
      raise ValueError(f"WorkerConfig.num_threads must be >= 0, got {self.num_threads}")
    if self.num_processes < 1:
      raise ValueError(f"WorkerConfig.num_processes must be >= 1, got {self.num_processes}")
    if self.step_timeout_s <= 0:
      raise ValueError(f"WorkerConfig.step_timeout_s must be > 0, got {self.step_timeout_s}")
    if self.startup_timeout_s <= 0:
      raise ValueError(f"WorkerConfig.startup_timeout_s must be > 0, got {self.startup_timeout_s}")


EnvFactory = str | Callable[..., Any]


def build_env(factory: EnvFactory, kwargs: dict[str, Any]):
  """An env from a registry name or a callable."""
  if isinstance(factory, str):
    from agentrl_jax import envs  # registers every built-in env; pylint: disable=import-outside-toplevel
    return envs.make(factory, **kwargs)
  return factory(**kwargs)


def _worker_main(conn) -> None:
  """A worker process: owns envs by id and answers one reply per request, in order."""
  envs: dict[int, Any] = {}
  conn.send((True, "ready"))
  while True:
    try:
      op, env_id, arg = conn.recv()
    except EOFError:
      return
    if op == "close":
      return
    try:
      if op == "make":
        env = envs[env_id] = build_env(*arg)
        # The rules are fixed when the env is built; a chat model's system message needs them.
        reply = {"action_words": getattr(env, "action_words", None),
                 "max_turns": getattr(env, "max_turns", None), "name": getattr(env, "name", ""),
                 "instructions": getattr(env, "instructions", "") or ""}
      elif op == "drop":
        reply = envs.pop(env_id, None) is not None
      elif op == "replay":
        seed, actions = arg
        envs[env_id].reset(seed)
        for action in actions:
          _safe_step(envs[env_id], action)
        reply = None
      elif op == "reset":
        reply = envs[env_id].reset(arg)
      elif op == "step":
        reply = _safe_step(envs[env_id], arg)
      elif op == "call":
        reply = getattr(envs[env_id], arg)()
      else:
        raise ValueError(f"unknown worker request {op!r}")
      ok = True
    except Exception as e:  # pylint: disable=broad-except
      ok, reply = False, f"{type(e).__name__}: {e}"
    try:
      conn.send((ok, reply))
    except Exception as e:  # pylint: disable=broad-except
      # Pickling fails before anything is written, so the reply stream stays in order.
      detail = f"the result cannot be sent back from the worker ({type(e).__name__}: {e})"
      conn.send((True, StepFault("garbage", detail)) if op == "step" else (False, detail))


class RemoteEnv:
  """Handle of an env that lives in a `ProcessPool` worker; the rollout loop uses it as an env.

  It remembers its seed and the actions since that reset, so a fresh worker can rebuild it.
  Only steps are fault-isolated (`EnvStepper.step`); a reset or expert_action that fails or
  hangs raises RuntimeError (the worker is replaced first, so the other envs play on).
  """

  def __init__(self, pool: "ProcessPool", worker: int, env_id: int, factory: EnvFactory,
               kwargs: dict[str, Any], info: dict[str, Any]):
    self.pool, self.worker, self.env_id = pool, worker, env_id
    self.factory, self.kwargs = factory, kwargs
    self.action_words = info["action_words"]
    self.max_turns = info["max_turns"]
    self.name = info["name"]
    self.instructions = info["instructions"]
    self.seed: int | None = None
    self.actions: list[str] = []
    self.lost: str | None = None  # why the env's state is gone (it must be reset before use)

  def reset(self, seed: int) -> str:
    return self.pool.reset(self, seed)

  def step(self, action: str) -> envs_base.StepResult:
    result = self.pool.step_many([self], [action])[0]
    if isinstance(result, StepFault):
      raise RuntimeError(f"remote env step failed ({result.kind}): {result.detail}")
    return result

  def expert_action(self) -> str:
    return self.pool.call(self, "expert_action")

  def close(self) -> None:
    """Frees the env in its worker; the handle cannot be used again."""
    self.pool.release(self)


class _Worker:

  def __init__(self, ctx, startup_timeout_s: float):
    self.conn, child = ctx.Pipe()
    self.process = ctx.Process(target=_worker_main, args=(child,), daemon=True)
    self.process.start()
    child.close()
    self.envs: list[RemoteEnv] = []
    if not self.conn.poll(startup_timeout_s):
      self.kill()
      raise RuntimeError(f"env worker process did not start within {startup_timeout_s} s")
    self.conn.recv()

  def kill(self) -> None:
    self.process.kill()
    self.process.join(5)
    self.conn.close()


class ProcessPool:
  """Worker processes that own envs; steps them concurrently with a per-step timeout.

  Processes are spawned, not forked: the parent runs JAX's threads, which a fork would copy
  mid-flight.
  """

  def __init__(self, config: WorkerConfig):
    self.config = config
    self._ctx = multiprocessing.get_context("spawn")
    self._workers = [_Worker(self._ctx, config.startup_timeout_s)
                     for _ in range(config.num_processes)]
    self._next_id = 0
    self.restarts = 0

  def make(self, factory: EnvFactory, **kwargs) -> RemoteEnv:
    """Builds an env in the next worker (round robin); `factory` and kwargs must pickle."""
    env_id, w = self._next_id, self._next_id % len(self._workers)
    self._next_id += 1
    info = self._request(w, ("make", env_id, (factory, kwargs)), self.config.startup_timeout_s)
    env = RemoteEnv(self, w, env_id, factory, kwargs, info)
    self._workers[w].envs.append(env)
    return env

  def reset(self, env: RemoteEnv, seed: int) -> str:
    if env not in self._workers[env.worker].envs:
      raise RuntimeError("RemoteEnv.reset: the env was closed")
    if env.lost is not None:  # its worker was replaced: build it again there
      self._request(env.worker, ("make", env.env_id, (env.factory, env.kwargs)),
                    self.config.startup_timeout_s)
      env.lost = None
    observation = self._request(env.worker, ("reset", env.env_id, int(seed)), self.config.step_timeout_s)
    env.seed, env.actions = int(seed), []
    return observation

  def release(self, env: RemoteEnv) -> None:
    worker = self._workers[env.worker]
    if env in worker.envs:
      worker.envs.remove(env)
      if env.lost is None:
        self._request(env.worker, ("drop", env.env_id, None), self.config.step_timeout_s)
    env.lost = "closed"

  def call(self, env: RemoteEnv, method: str):
    if env.lost is not None:
      raise RuntimeError(f"remote env was lost ({env.lost}); reset it first")
    return self._request(env.worker, ("call", env.env_id, method), self.config.step_timeout_s)

  def _request(self, w: int, message, timeout: float):
    """One synchronous request; a worker that hangs or dies is replaced and the call raises."""
    conn = self._workers[w].conn
    try:
      conn.send(message)
      if conn.poll(timeout):
        ok, reply = conn.recv()
        if not ok:
          raise RuntimeError(f"env {message[0]!r} failed in its worker process: {reply}")
        return reply
      reason = f"{message[0]!r} took longer than {timeout} s"
    except (EOFError, OSError) as e:
      reason = f"worker process died during {message[0]!r} ({type(e).__name__})"
    self._replace_worker(w, lost=[env for env in self._workers[w].envs if env.env_id == message[1]],
                         resend=[])
    raise RuntimeError(f"remote env request failed: {reason}")

  def step_many(self, envs: Sequence[RemoteEnv], actions: Sequence[str]
                ) -> list[envs_base.StepResult | StepFault]:
    """Steps every env once; each worker steps its envs in order, all workers at once.

    The timeout runs per step: from when the worker finished its previous step (or from the
    send, for its first). A worker past it is killed and replaced (`_replace_worker`).
    """
    timeout = self.config.step_timeout_s
    results: list[Any] = [None] * len(envs)
    queues: dict[int, collections.deque] = collections.defaultdict(collections.deque)
    for i, (env, action) in enumerate(zip(envs, actions)):
      if env.lost is not None:
        results[i] = StepFault("exception", f"env was lost earlier ({env.lost}) and not reset")
        continue
      queues[env.worker].append(i)
    for w, queue in queues.items():
      self._send_steps(w, [envs[i] for i in queue], [actions[i] for i in queue])
    started = {w: time.monotonic() for w in queues}
    while any(queues.values()):
      live = [w for w, queue in queues.items() if queue]
      wait_s = max(0.0, min(started[w] for w in live) + timeout - time.monotonic())
      ready = multiprocessing.connection.wait([self._workers[w].conn for w in live], wait_s)
      for w in live:
        if self._workers[w].conn not in ready:
          continue
        i = queues[w].popleft()
        try:
          ok, reply = self._workers[w].conn.recv()
          results[i] = reply if ok else StepFault("exception", reply)
        except (EOFError, OSError):
          results[i] = StepFault("exception", "the env's worker process died during the step")
          self._recover(w, envs, actions, queues[w], results, lost=envs[i])
        started[w] = time.monotonic()
      for w in live:
        # A reply already waiting is no timeout: the time may have gone on replacing another
        # worker here, not on this worker's step.
        if (queues[w] and time.monotonic() - started[w] > timeout
            and not self._workers[w].conn.poll(0)):
          i = queues[w].popleft()
          results[i] = StepFault("timeout", f"step took longer than {timeout} s")
          self._recover(w, envs, actions, queues[w], results, lost=envs[i])
          started[w] = time.monotonic()
    return results

  def _recover(self, w, envs, actions, queue, results, *, lost: RemoteEnv) -> None:
    """Replaces worker w; its unanswered steps go to the new one, or fault if it cannot rebuild."""
    if not self._replace_worker(w, lost=[lost], resend=[(envs[j], actions[j]) for j in queue]):
      for j in queue:
        results[j] = StepFault("exception", f"env was lost: {envs[j].lost}")
      queue.clear()

  def _send_steps(self, w: int, envs: Sequence[RemoteEnv], actions: Sequence[str]) -> None:
    for env, action in zip(envs, actions):
      env.actions.append(action)
      try:
        self._workers[w].conn.send(("step", env.env_id, action))
      except OSError:
        # The worker died on an earlier step of this batch. Its death is read at that step's
        # reply (EOF); the steps after it count as sent and unanswered, so `_recover` replays
        # them on the replacement like any other.
        pass

  def _replace_worker(self, w: int, *, lost: Sequence[RemoteEnv],
                      resend: Sequence[tuple[RemoteEnv, str]]) -> bool:
    """Kills worker w, starts a fresh one and rebuilds its envs there by replay.

    `lost` envs are not rebuilt (their state went with the hung step); `resend` steps were sent
    to the old worker but not answered, so they are replayed without their last action and
    sent again. Returns False if the rebuild failed: then every env of the worker is lost (it
    starts over at its next reset) and nothing is resent.
    """
    old = self._workers[w]
    old.kill()
    self.restarts += 1
    for env in lost:
      env.lost = "its worker process was killed"
    for env, _ in resend:
      env.actions.pop()
    new = self._workers[w] = _Worker(self._ctx, self.config.startup_timeout_s)
    new.envs = old.envs
    keep = [env for env in old.envs if env.lost is None]
    try:
      for env in keep:
        new.conn.send(("make", env.env_id, (env.factory, env.kwargs)))
        if env.seed is not None:
          new.conn.send(("replay", env.env_id, (env.seed, list(env.actions))))
      budget = self.config.startup_timeout_s + self.config.step_timeout_s * (
          len(keep) + sum(len(env.actions) for env in keep))
      deadline = time.monotonic() + budget
      for env in keep:
        for _ in range(1 if env.seed is None else 2):
          if not new.conn.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"replay took longer than {budget:.0f} s")
          ok, reply = new.conn.recv()
          if not ok:
            raise RuntimeError(reply)
    except Exception as e:  # pylint: disable=broad-except
      # The replay failed too: every env of this worker starts over at its next reset.
      new.kill()
      for env in keep:
        env.lost = f"rebuilding it in a fresh worker failed ({type(e).__name__}: {e})"
      new = self._workers[w] = _Worker(self._ctx, self.config.startup_timeout_s)
      new.envs = old.envs
      return False
    self._send_steps(w, [env for env, _ in resend], [action for _, action in resend])
    return True

  def close(self) -> None:
    for worker in self._workers:
      try:
        worker.conn.send(("close", -1, None))
      except OSError:
        pass
    for worker in self._workers:
      worker.process.join(2)
      if worker.process.is_alive():
        worker.process.kill()
      worker.conn.close()


class EnvStepper:
  """Steps the given envs with their actions; returns a result or a fault per env.

  Envs built by `make_env` under kind='process' are `RemoteEnv`s and are stepped by their
  worker processes; any other env is stepped here (threads or in turn).
  """

  def __init__(self, config: WorkerConfig = WorkerConfig()):
    self.config = config
    self._pool = (concurrent.futures.ThreadPoolExecutor(config.num_threads, "env")
                  if config.kind == "thread" and config.num_threads else None)
    self._processes: ProcessPool | None = None

  def make_env(self, factory: EnvFactory, **kwargs):
    """An env for this stepper: local for 'thread', a `RemoteEnv` in a worker for 'process'."""
    if self.config.kind == "thread":
      return build_env(factory, kwargs)
    if self._processes is None:
      self._processes = ProcessPool(self.config)
    return self._processes.make(factory, **kwargs)

  def step(self, envs: Sequence[Any], actions: Sequence[str]
           ) -> list[envs_base.StepResult | StepFault]:
    remote = [isinstance(env, RemoteEnv) for env in envs]
    if any(remote):
      if not all(remote):
        raise ValueError("EnvStepper.step: a batch mixes local envs and RemoteEnvs; build all with "
                         "EnvStepper.make_env")
      return self._step_remote(envs, actions)
    if self._pool is None:
      return [_safe_step(env, action) for env, action in zip(envs, actions)]
    futures = [self._pool.submit(_safe_step, env, action) for env, action in zip(envs, actions)]
    done, _ = concurrent.futures.wait(futures, timeout=self.config.step_timeout_s)
    return [f.result() if f in done else
            StepFault("timeout", f"step took longer than {self.config.step_timeout_s} s")
            for f in futures]

  def _step_remote(self, envs, actions):
    results: list[Any] = [None] * len(envs)
    pools = {id(env.pool): env.pool for env in envs}
    for key, pool in pools.items():
      rows = [i for i, env in enumerate(envs) if id(env.pool) == key]
      for i, result in zip(rows, pool.step_many([envs[i] for i in rows], [actions[i] for i in rows])):
        results[i] = result
    return results

  def close(self) -> None:
    if self._pool is not None:
      # Hung steps cannot be interrupted; do not wait for them.
      self._pool.shutdown(wait=False, cancel_futures=True)
    if self._processes is not None:
      self._processes.close()
