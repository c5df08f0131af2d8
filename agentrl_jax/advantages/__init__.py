"""Advantage estimation: Trajectories (+ critic values) -> token advantages [B, L].

Modules: gae (GAE kernels, token rewards), whiten (masked moments), group (GRPO, Dr.GRPO, RLOO,
StarPO-S filter), step (GiGPO, GAGPO, anchor-state groups), turn (MT-GRPO, GTPO, hybrid),
similarity (SPO), density (gradient SNR, decision density), estimators (the pipeline-facing
registry `ESTIMATORS`, `get_estimator`), layout (verl-agent step rows: `flatten_to_steps`,
`steps_to_flatten`, `on_step_rows` to run any estimator on step rows).
"""
