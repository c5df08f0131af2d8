"""Rollout strategies: how a batch of episodes is sampled, beyond one plain pass.

Each strategy is a frozen dataclass with
`collect(runner, make_env, seeds, group_ids, *, params, rng, row_ids) -> (Trajectories, RolloutStats)`
returning ordinary `Trajectories` of exactly `len(seeds)` rows, with the sampler's log-probs of
the kept tokens (TITO), so any estimator and the PPO loss follow unchanged. Chosen in gin with
`learner.train.strategy = @tsr.BestOfN()` (or `@tsr.FilterInstances()`, `@t2po.TurnResampling()`,
`@arpo.EntropyBranching()`). RTPO changes the training schedule itself: its tree sampling is here, its trainer
(`learner.run.entry = @rtpo.train`) is `offline/rtpo.py`.

  tsr.py     TSR best-of-N action selection and instance filtering (docs/methods.md#tsr)
  t2po.py    T²PO turn-level dynamic sampling (docs/methods.md#t2po)
  arpo.py    ARPO entropy-triggered branching (docs/methods.md#arpo)
  rtpo.py    RTPO's sparse reverse trees: roots, prefixes, per-depth continuations
  teacher.py the privileged teacher AHEAD and SERL share (AHEAD)
  common.py  the shared machinery: rows mid-episode, re-sampling a turn, forking rows
"""
