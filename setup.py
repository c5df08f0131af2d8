"""Package metadata for agentrl_jax.

Lower bounds are the major.minor releases the library is developed and tested against; the core
install is CPU-only and small, accelerators and optional integrations come from extras.
"""

import pathlib
import re

import setuptools

_ROOT = pathlib.Path(__file__).parent


def _version() -> str:
  """Reads `__version__` from the package without importing it (and so without jax)."""
  text = (_ROOT / "agentrl_jax" / "__init__.py").read_text()
  return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def _long_description() -> str:
  readme = _ROOT / "README.md"
  return readme.read_text() if readme.exists() else ""


_CORE = [
    "jax>=0.10",
    "flax>=0.12",
    "optax>=0.2",
    "orbax-checkpoint>=0.12",
    "chex>=0.1",
    "sentencepiece>=0.2",
    "numpy>=2.4",
    "gin-config>=0.5",
    "tqdm>=4.70",  # Progress bar.
    "tensorboardX>=2.6",  # TensorBoard event writer without TensorFlow.
    "etils[epath]",  # Paths that may be gs:// (viewer reports).
    "safetensors>=0.6",  # HF checkpoints: memory-mapped reads, per-device slices (models/hf.py).
]

# Light engines of the environment suite; the default test suite exercises them, so `dev` has them.
_LIGHT_ENVS = [
    "sqlglot>=30",  # SQL clause diagnostics (Progress-SQL).
    "bm25s>=0.3",  # search_qa retriever.
    "tensorflow-datasets>=4.9",  # Task sets as array_record datasets, read without TensorFlow.
    "array_record>=0.8",
    "importlib_resources>=7",  # tfds builders defined inside a package need it.
]

_EXTRAS = {
    # rlax is a reference implementation that `*_vs_reference_test.py` compares against;
    # hypothesis drives the property-based tests.
    # matplotlib: CI executes the study notebooks at SMALL size.
    # wandb: the W&B writer's test runs it in offline mode.
    "dev": ["pytest>=9.0", "pytest-xdist>=3.8", "rlax>=0.1", "hypothesis>=6.155", "matplotlib>=3.11",
            "wandb>=0.22"] + _LIGHT_ENVS,
    # TextWorld engines: heavy (spaCy, jericho) and, for TextWorld-Express, Java on PATH. Their
    # tests skip with a reason where these are absent.
    "envs": _LIGHT_ENVS + ["textworld==1.7.0", "textworld-express==1.1.0"],
    # transformers and torch serve the logit parity tests and bench/models.py, tokenizers the tokenizer.json path. torch is pinned: an
    # unpinned torch resolves to a multi-GB CUDA build. gguf reads and dequantizes .gguf files and
    # jinja2 renders their chat templates (models/gguf.py); accelerate is what transformers needs
    # to load a GGUF file as the tests' reference.
    "hf": ["transformers", "safetensors", "tokenizers", "torch==2.13.0", "gguf", "jinja2",
           "accelerate"],
    # A gs:// workdir: etils.epath reaches Cloud Storage through gcsfs (configs, metrics,
    # reports); tensorboardX writes its event files there with google-cloud-storage.
    "tpu": ["jax[tpu]>=0.10", "gcsfs", "google-cloud-storage"],
    "gpu": ["jax[cuda12]>=0.10", "gcsfs", "google-cloud-storage"],
    # The TensorBoard viewer for the event files the learner writes (`tensorboard --logdir ...`);
    # writing them needs only tensorboardX, in the core install.
    "tensorboard": ["tensorboard>=2.21"],
    # Weights & Biases logging beside JSONL and TensorBoard (`metrics.WandbConfig` in gin).
    "wandb": ["wandb>=0.22"],
    "notebooks": ["jupytext>=1.19", "matplotlib>=3.11", "nbclient>=0.11", "ipykernel>=7.4",
                  "nbconvert>=7.17"],
}

setuptools.setup(
    name="agentrl_jax",
    version=_version(),
    description="Reinforcement learning of multi-turn LLM agents in JAX.",
    long_description=_long_description(),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["agentrl_jax", "agentrl_jax.*"]),
    # The SentencePiece tokenizer model ships inside the package.
    package_data={"agentrl_jax": ["assets/**/*"]},
    include_package_data=True,
    # numpy 2.4, jax 0.10, flax 0.12 and orbax 0.12 need Python 3.11.
    python_requires=">=3.11",
    install_requires=_CORE,
    extras_require=_EXTRAS,
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
