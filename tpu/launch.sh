#!/usr/bin/env bash
# Starts experiments/run.py on every worker of a TPU VM, in the background, one log per worker.
#
# Usage:
#   tpu/launch.sh --name=NAME --zone=ZONE --gin_file=FILE --workdir=gs://BUCKET/PATH
#                 [--gin_bindings=BINDING ...] [--project=PROJECT] [--remote-dir=DIR]
#                 [--venv=DIR] [--log=FILE] [--dry-run]
#
#   --name, --zone, --project  the TPU VM (defaults: $TPU_NAME, $TPU_ZONE, $TPU_PROJECT)
#   --gin_file      gin config, relative to the code directory; repeatable
#   --gin_bindings  a gin binding such as 'configs.TrainConfig.num_iterations = 50'; repeatable
#   --workdir       gs:// path every worker writes checkpoints and metrics to
#   --remote-dir    the code on the workers, relative to home (default agentrl_jax)
#   --venv          the virtual environment, relative to home (default agentrl_venv)
#   --log           log file on each worker, relative to home (default agentrl_logs/run.log)
#   --dry-run       print the gcloud command instead of running it
#
# Every hyperparameter goes through gin; this script only passes the flags on. A worker that
# still runs a job started by this script is left alone (its pid is in <log>.pid), so running
# the same command twice starts one job. Watch it with tpu/logs.sh; stop it with tpu/delete.sh.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(name zone project workdir remote-dir venv log)
LIST_FLAGS=(gin_file gin_bindings)
SWITCH_FLAGS=()
NAME="${TPU_NAME:-}" ZONE="${TPU_ZONE:-}" PROJECT="${TPU_PROJECT:-}"
WORKDIR="" REMOTE_DIR="agentrl_jax" VENV="agentrl_venv" LOG="agentrl_logs/run.log"
GIN_FILE=() GIN_BINDINGS=()
parse_flags "$@"
require name zone gin_file workdir
require_plain_path remote-dir venv log
[[ "${WORKDIR}" == gs://* ]] ||
  die "--workdir must be a gs:// path that every worker can write, got '${WORKDIR}'"
location_flags

train=("\$HOME/${VENV}/bin/python" experiments/run.py)
for file in "${GIN_FILE[@]}"; do
  train+=("--gin_file=${file}")
done
train+=("--workdir=${WORKDIR}")
for binding in "${GIN_BINDINGS[@]}"; do
  train+=("--gin_bindings=${binding}")
done
# The python path stays unquoted so that the worker's shell expands $HOME.
command_line="${train[0]} $(quote_all "${train[@]:1}")"
log="\$HOME/${LOG}"
remote="set -e; cd \$HOME/${REMOTE_DIR}; mkdir -p \$(dirname ${log}); \
if [ -f ${log}.pid ] && kill -0 \$(cat ${log}.pid) 2>/dev/null; then \
echo \"\$(hostname): already running (pid \$(cat ${log}.pid))\"; exit 0; fi; \
nohup ${command_line} > ${log} 2>&1 < /dev/null & echo \$! > ${log}.pid; \
echo \"\$(hostname): started pid \$!, log ${log}\""
run gcloud compute tpus tpu-vm ssh "${NAME}" "${LOCATION[@]}" --worker=all "--command=${remote}"
