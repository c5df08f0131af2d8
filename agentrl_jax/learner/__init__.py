"""The learner: state, the jitted update, one iteration, checkpoints and metrics."""
