#!/usr/bin/env bash
# Deletes a TPU VM (or its queued resource) and stops its billing; does nothing if it is gone.
#
# Usage:
#   tpu/delete.sh --name=NAME --zone=ZONE [--project=PROJECT] [--queued] [--dry-run]
#
#   --name, --zone, --project  the TPU VM (defaults: $TPU_NAME, $TPU_ZONE, $TPU_PROJECT)
#   --queued      it was created with tpu/create.sh --queued: delete the queued resource and,
#                 with it, the TPU VM
#   --dry-run     print the gcloud command instead of running it
#
# The workdir on gs:// is kept; delete it with `gcloud storage rm -r gs://...` when done.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(name zone project)
LIST_FLAGS=()
SWITCH_FLAGS=(queued)
NAME="${TPU_NAME:-}" ZONE="${TPU_ZONE:-}" PROJECT="${TPU_PROJECT:-}" QUEUED=0
parse_flags "$@"
require name zone
location_flags

if (( ! DRY_RUN )) && ! tpu_exists; then
  echo "${NAME} does not exist in ${ZONE}; nothing to do." >&2
  exit 0
fi
if (( QUEUED )); then
  run gcloud compute tpus queued-resources delete "${NAME}" "${LOCATION[@]}" --force --quiet
else
  run gcloud compute tpus tpu-vm delete "${NAME}" "${LOCATION[@]}" --quiet
fi
