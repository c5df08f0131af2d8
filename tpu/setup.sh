#!/usr/bin/env bash
# Puts the code and a Python environment on every worker of a TPU VM; safe to run again.
#
# Usage:
#   tpu/setup.sh --name=NAME --zone=ZONE [--project=PROJECT] [--repo=GIT_URL [--ref=REF]]
#                [--remote-dir=DIR] [--venv=DIR] [--python=VERSION] [--dry-run]
#
#   --name, --zone, --project  the TPU VM (defaults: $TPU_NAME, $TPU_ZONE, $TPU_PROJECT)
#   --repo        clone this git URL on the workers (and check out --ref, default main);
#                 without it, this checkout (minus .git, .venv and runs/) is copied over
#   --remote-dir  where the code goes, relative to the worker's home (default agentrl_jax)
#   --venv        the virtual environment, relative to home (default agentrl_venv)
#   --python      the venv's Python, 3.11 or newer (default 3.11)
#   --dry-run     print the commands instead of running them
#
# On every worker (--worker=all): the code, then a Python of --python's version (the TPU VM
# images ship Python 3.10, and numpy 2.4 and jax 0.10 need 3.11; uv, installed into
# ~/.local/bin if absent, fetches a standalone build without sudo), a venv made with it (an
# existing venv on an older Python is replaced), `pip install 'jax[tpu]'` and
# `pip install -e '.[tpu]'`. Check it with
#   gcloud compute tpus tpu-vm ssh NAME --zone=ZONE --worker=all \
#     --command='agentrl_venv/bin/python -c "import jax; print(jax.device_count())"'
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(name zone project repo ref remote-dir venv python)
LIST_FLAGS=()
SWITCH_FLAGS=()
NAME="${TPU_NAME:-}" ZONE="${TPU_ZONE:-}" PROJECT="${TPU_PROJECT:-}"
REPO="" REF="main" REMOTE_DIR="agentrl_jax" VENV="agentrl_venv" PYTHON="3.11"
parse_flags "$@"
require name zone remote-dir venv python
require_plain_path remote-dir venv
[[ "${PYTHON}" =~ ^3\.([0-9]+)$ ]] && (( BASH_REMATCH[1] >= 11 )) ||
  die "--python must be a version 3.11 or newer such as 3.12, got '${PYTHON}'"
location_flags

on_all_workers() {
  run gcloud compute tpus tpu-vm ssh "${NAME}" "${LOCATION[@]}" --worker=all "--command=$1"
}

dir="\$HOME/${REMOTE_DIR}"
if [[ -n "${REPO}" ]]; then
  # fetch + detached checkout of FETCH_HEAD works for a branch, a tag or a commit alike.
  on_all_workers "set -e; [ -d ${dir}/.git ] || git clone --quiet $(quote "${REPO}") ${dir}; \
git -C ${dir} fetch --quiet origin $(quote "${REF}"); git -C ${dir} checkout --quiet --detach FETCH_HEAD"
else
  archive="${TMPDIR:-/tmp}/agentrl_jax-${NAME}.tar.gz"
  source_dir="${REPO_ROOT}"
  if [[ "${PWD}" == "${REPO_ROOT}" ]]; then
    source_dir="."
  fi
  run tar -C "${source_dir}" --exclude=.git --exclude=.venv --exclude=runs --exclude=__pycache__ -czf "${archive}" .
  run gcloud compute tpus tpu-vm scp "${archive}" "${NAME}:agentrl_jax.tar.gz" "${LOCATION[@]}" \
    --worker=all
  on_all_workers "set -e; mkdir -p ${dir}; tar -xzf \$HOME/agentrl_jax.tar.gz -C ${dir}"
fi
venv="\$HOME/${VENV}"
pip="${venv}/bin/pip"
minor="${PYTHON#3.}"
# The venv is kept when its Python is new enough, else made afresh with uv's Python.
python_ok="${venv}/bin/python -c 'import sys; sys.exit(sys.version_info < (3, ${minor}))'"
on_all_workers "set -e; export PATH=\$HOME/.local/bin:\$PATH; \
command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh; \
uv python install ${PYTHON}; \
if ! ${python_ok} 2>/dev/null; then rm -rf ${venv}; \$(uv python find ${PYTHON}) -m venv ${venv}; fi; \
${python_ok}; ${pip} install --quiet --upgrade pip; \
${pip} install --quiet 'jax[tpu]'; cd ${dir} && ${pip} install --quiet -e '.[tpu]'"
