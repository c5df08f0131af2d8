"""Credit corrections, after any estimator: `fn(traj, advantages [B, L]) -> advantages [B, L]`.

Modules: gca (B.2), c3 (B.3), deltattg (B.4), pearl (B.5), serl (B.13), and spans (turn and
span views the methods share). A correction never learns which estimator ran.
"""
