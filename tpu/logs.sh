#!/usr/bin/env bash
# Shows the log of one worker's job started by tpu/launch.sh (follows it by default).
#
# Usage:
#   tpu/logs.sh --name=NAME --zone=ZONE [--worker=N] [--lines=N] [--no-follow]
#               [--project=PROJECT] [--log=FILE] [--dry-run]
#
#   --name, --zone, --project  the TPU VM (defaults: $TPU_NAME, $TPU_ZONE, $TPU_PROJECT)
#   --worker      which worker (default 0, the one that writes metrics and checkpoints)
#   --lines       lines of history to show first (default 100)
#   --no-follow   print and exit instead of following the log
#   --log         log file relative to home, as given to tpu/launch.sh (default
#                 agentrl_logs/run.log)
#   --dry-run     print the gcloud command instead of running it
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(name zone project worker lines log)
LIST_FLAGS=()
SWITCH_FLAGS=(no-follow)
NAME="${TPU_NAME:-}" ZONE="${TPU_ZONE:-}" PROJECT="${TPU_PROJECT:-}"
WORKER=0 LINES=100 LOG="agentrl_logs/run.log" NO_FOLLOW=0
parse_flags "$@"
require name zone worker lines
require_plain_path log
[[ "${WORKER}" =~ ^[0-9]+$ ]] || die "--worker must be a worker number, got '${WORKER}'"
[[ "${LINES}" =~ ^[0-9]+$ ]] || die "--lines must be a number, got '${LINES}'"
location_flags

tail_command="tail -n ${LINES}"
if (( ! NO_FOLLOW )); then
  tail_command+=" -F"
fi
run gcloud compute tpus tpu-vm ssh "${NAME}" "${LOCATION[@]}" "--worker=${WORKER}" \
  "--command=${tail_command} \$HOME/${LOG}"
