"""Credit corrections, after any estimator: `fn(traj, advantages [B, L]) -> advantages [B, L]`.

Modules: gca (B.2), c3 (B.3), deltattg (B.4), pearl (B.5), serl (B.13); the turn and span
views they share are `agentrl_jax.trajectory`. A correction never learns which estimator ran.
"""
