"""TFDS task-set builders for the data-driven environments (see `common`).

Importing a builder module registers its dataset name with TFDS; this package imports none of
them eagerly, so `import agentrl_jax.envs` never imports tensorflow_datasets.
"""
