"""Credit corrections, after any estimator: `fn(traj, advantages [B, L]) -> advantages [B, L]`.

Modules: gca, c3, deltattg, pearl, serl; the turn and span
views they share are `agentrl_jax.trajectory`. A correction never learns which estimator ran.
"""
