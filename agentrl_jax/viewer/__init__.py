"""Trajectory viewer: static HTML reports of conversations with their token advantages.

`report.write_report` is called by the learner at each evaluation; `python -m agentrl_jax.viewer
--workdir W` writes one on demand from the latest checkpoint. See docs/viewer.md.
"""
