"""Reward shaping, before any estimator: `fn(traj) -> traj` with new turn rewards.

Modules: curiosity (duplicate-observation penalty, B.1), progress (Progress-SQL, B.11),
process (SocialRL stage-aware process rewards, B.7; T1 verifier-count reward, B.6), calibration
(Iterative Reward Calibration of per-turn reward features, B.17).
"""
