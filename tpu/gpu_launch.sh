#!/usr/bin/env bash
# Starts experiments/run.py on this GPU host, in the background with a log; one process uses
# every local GPU. For several hosts, run it on each with the same coordinator, the number of
# processes and this host's process id.
#
# Usage:
#   tpu/gpu_launch.sh --gin_file=FILE --workdir=DIR [--gin_bindings=BINDING ...]
#                     [--coordinator-address=HOST:PORT --num-processes=N --process-id=I]
#                     [--gpus=0,1,...] [--log=FILE] [--python=PYTHON] [--foreground] [--dry-run]
#
#   --gin_file             gin config; repeatable
#   --gin_bindings         a gin binding such as 'configs.TrainConfig.num_iterations = 50';
#                          repeatable
#   --workdir              checkpoints and metrics; with several hosts a directory all of them
#                          write (a shared file system or gs://)
#   --coordinator-address  host:port of process 0 (default: $JAX_COORDINATOR_ADDRESS)
#   --num-processes        processes in the job, one per host (default: $JAX_NUM_PROCESSES, else 1)
#   --process-id           this host's process, 0 .. N-1 (default: $JAX_PROCESS_ID)
#   --gpus                 CUDA_VISIBLE_DEVICES for the job (default: all GPUs)
#   --log                  log file (default: <workdir>.log when the workdir is local, else
#                          agentrl_run.log in the current directory)
#   --python               interpreter (default: python3)
#   --foreground           run in the foreground instead of with nohup in the background
#   --dry-run              print the command instead of running it
#
# The job sees JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID in its environment,
# which experiments/run.py hands to jax.distributed.initialize (see tpu/README.md, GPU hosts).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(workdir coordinator-address num-processes process-id gpus log python)
LIST_FLAGS=(gin_file gin_bindings)
SWITCH_FLAGS=(foreground)
WORKDIR="" GPUS="" LOG="" PYTHON="python3" FOREGROUND=0
COORDINATOR_ADDRESS="${JAX_COORDINATOR_ADDRESS:-}"
NUM_PROCESSES="${JAX_NUM_PROCESSES:-1}"
PROCESS_ID="${JAX_PROCESS_ID:-}"
GIN_FILE=() GIN_BINDINGS=()
parse_flags "$@"
require gin_file workdir python num-processes
[[ "${NUM_PROCESSES}" =~ ^[1-9][0-9]*$ ]] ||
  die "--num-processes must be a positive integer, got '${NUM_PROCESSES}'"

environment=()
if (( NUM_PROCESSES > 1 )); then
  require coordinator-address process-id
  [[ "${COORDINATOR_ADDRESS}" =~ ^[^:]+:[0-9]+$ ]] ||
    die "--coordinator-address must be host:port, got '${COORDINATOR_ADDRESS}'"
  [[ "${PROCESS_ID}" =~ ^[0-9]+$ ]] && (( PROCESS_ID < NUM_PROCESSES )) ||
    die "--process-id must be in [0, ${NUM_PROCESSES}), got '${PROCESS_ID}'"
  environment+=("JAX_COORDINATOR_ADDRESS=${COORDINATOR_ADDRESS}"
                "JAX_NUM_PROCESSES=${NUM_PROCESSES}" "JAX_PROCESS_ID=${PROCESS_ID}")
fi
if [[ -n "${GPUS}" ]]; then
  environment+=("CUDA_VISIBLE_DEVICES=${GPUS}")
fi
if [[ -z "${LOG}" ]]; then
  if [[ "${WORKDIR}" == *://* ]]; then
    LOG="agentrl_run.log"
  else
    LOG="${WORKDIR%/}.log"
  fi
fi

train=("${PYTHON}" "${REPO_ROOT}/experiments/run.py")
for file in "${GIN_FILE[@]}"; do
  train+=("--gin_file=${file}")
done
train+=("--workdir=${WORKDIR}")
for binding in "${GIN_BINDINGS[@]}"; do
  train+=("--gin_bindings=${binding}")
done
command_words=(env "${environment[@]}" "${train[@]}")

if (( FOREGROUND )); then
  run "${command_words[@]}"
elif (( DRY_RUN )); then
  echo "+ nohup $(quote_all "${command_words[@]}") > $(quote "${LOG}") 2>&1 < /dev/null &"
else
  mkdir -p "$(dirname "${LOG}")"
  nohup "${command_words[@]}" > "${LOG}" 2>&1 < /dev/null &
  echo "started pid $!, log ${LOG}"
fi
