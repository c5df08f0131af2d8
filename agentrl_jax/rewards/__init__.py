"""Reward shaping, before any estimator: `fn(traj) -> traj` with new turn rewards.

Modules: curiosity (duplicate-observation penalty), progress (Progress-SQL),
process (SocialRL stage-aware process rewards, SocialRL; T1 verifier-count reward), calibration
(Iterative Reward Calibration of per-turn reward features), potential (potential-based progress
shaping), format (a penalty per invalid action).
"""
