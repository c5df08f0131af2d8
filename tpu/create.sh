#!/usr/bin/env bash
# Creates a Cloud TPU VM, or a queued resource that becomes one; does nothing if it exists.
#
# Usage:
#   tpu/create.sh --name=NAME --zone=ZONE --accelerator-type=TYPE [--runtime-version=VERSION]
#                 [--project=PROJECT] [--spot] [--queued] [--dry-run]
#
#   --name              TPU VM name (default: $TPU_NAME)
#   --zone              zone with quota for TYPE, e.g. us-west4-a (default: $TPU_ZONE)
#   --project           GCP project (default: $TPU_PROJECT, else gcloud's core/project)
#   --accelerator-type  e.g. v5litepod-8, v5litepod-16, v4-32, v6e-8
#   --runtime-version   TPU software image; default by generation: v5litepod/v5e
#                       v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e,
#                       v4 tpu-ubuntu2204-base (list: gcloud compute tpus tpu-vm versions list)
#   --spot              spot capacity: much cheaper, can be reclaimed at any time
#   --queued            request through the queued-resources API (waits for capacity instead
#                       of failing); watch it with
#                       gcloud compute tpus queued-resources describe NAME --zone=ZONE
#   --dry-run           print the gcloud command instead of running it
#
# Example:
#   tpu/create.sh --name=agentrl --zone=us-west4-a --accelerator-type=v5litepod-16 --spot
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(name zone project accelerator-type runtime-version)
LIST_FLAGS=()
SWITCH_FLAGS=(spot queued)
NAME="${TPU_NAME:-}" ZONE="${TPU_ZONE:-}" PROJECT="${TPU_PROJECT:-}"
ACCELERATOR_TYPE="" RUNTIME_VERSION="" SPOT=0 QUEUED=0
parse_flags "$@"
require name zone accelerator-type

default_runtime_version() {
  case "$1" in
    v5litepod-*|v5e-*) echo "v2-alpha-tpuv5-lite" ;;
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v6e-*) echo "v2-alpha-tpuv6e" ;;
    v4-*) echo "tpu-ubuntu2204-base" ;;
    *) die "no default --runtime-version for accelerator type '$1'; pass one" ;;
  esac
}
if [[ -z "${RUNTIME_VERSION}" ]]; then
  RUNTIME_VERSION="$(default_runtime_version "${ACCELERATOR_TYPE}")"
fi
location_flags

if (( ! DRY_RUN )) && tpu_exists; then
  echo "${NAME} already exists in ${ZONE}; nothing to do." >&2
  exit 0
fi

capacity=()
if (( SPOT )); then
  capacity=(--spot)
fi
if (( QUEUED )); then
  run gcloud compute tpus queued-resources create "${NAME}" "--node-id=${NAME}" "${LOCATION[@]}" \
    "--accelerator-type=${ACCELERATOR_TYPE}" "--runtime-version=${RUNTIME_VERSION}" "${capacity[@]}"
else
  run gcloud compute tpus tpu-vm create "${NAME}" "${LOCATION[@]}" \
    "--accelerator-type=${ACCELERATOR_TYPE}" "--version=${RUNTIME_VERSION}" "${capacity[@]}"
fi
