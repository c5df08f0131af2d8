"""Losses: policy (PPO clip, aggregation, entropy), kl (KL estimators), value (clipped value loss)."""
