"""Advantage estimation: Trajectories (+ critic values) -> token advantages [B, L].

Modules: gae (GAE kernels, token rewards), whiten (masked moments), group (GRPO, Dr.GRPO, RLOO,
StarPO-S filter), step (GiGPO, GAGPO), turn (MT-GRPO, GTPO, hybrid), density (gradient SNR,
decision density), estimators (the pipeline-facing registry `ESTIMATORS`, `get_estimator`).
"""
