# Shared helpers of the tpu/ scripts; sourced, never run.
#
# Each script declares its flags in three arrays before calling `parse_flags "$@"`:
#   VALUE_FLAGS   flags taking one value (`--zone=us-west4-a` or `--zone us-west4-a`);
#   LIST_FLAGS    repeatable value flags, collected into a bash array;
#   SWITCH_FLAGS  flags without a value, set to 1 when given.
# A flag `--accelerator-type` is stored in the variable ACCELERATOR_TYPE. `--help` prints the
# script's header comment; `--dry-run` makes `run` print each command instead of executing it.

set -euo pipefail

TPU_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${TPU_DIR}/.." && pwd)"
DRY_RUN=0

die() {
  echo "$(basename "$0"): error: $*" >&2
  exit 2
}

usage() {
  # The header comment of the calling script, without the leading '# '.
  sed -n '2,/^[^#]/{/^#/!q;s/^# \{0,1\}//p;}' "$0"
}

# Prints one argument so that a POSIX shell reads it back unchanged: bare when it only holds
# safe characters, otherwise in single quotes (an embedded ' becomes '\'').
quote() {
  local s="$1"
  if [[ -n "${s}" && "${s}" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "${s}"
  else
    printf "'%s'" "${s//\'/\'\\\'\'}"
  fi
}

# The words of a command, quoted, on one line.
quote_all() {
  local out="" arg
  for arg in "$@"; do
    out+="${out:+ }$(quote "${arg}")"
  done
  printf '%s' "${out}"
}

# Runs a command, or with --dry-run prints it as `+ cmd arg ...`, shell-quoted, one per line.
run() {
  if (( DRY_RUN )); then
    echo "+ $(quote_all "$@")"
  else
    "$@"
  fi
}

_contains() {
  local needle="$1" item
  shift
  for item in "$@"; do
    [[ "${item}" == "${needle}" ]] && return 0
  done
  return 1
}

_variable() {
  local name="${1//-/_}"
  printf '%s' "${name^^}"
}

parse_flags() {
  local arg name value has_value variable
  while (( $# )); do
    arg="$1"
    shift
    case "${arg}" in
      -h|--help) usage; exit 0 ;;
      --dry-run) DRY_RUN=1; continue ;;
      --*=*) name="${arg%%=*}"; name="${name#--}"; value="${arg#*=}"; has_value=1 ;;
      --*) name="${arg#--}"; value=""; has_value=0 ;;
      *) die "unexpected argument '${arg}' (flags only; see --help)" ;;
    esac
    variable="$(_variable "${name}")"
    if _contains "${name}" "${SWITCH_FLAGS[@]}"; then
      (( has_value )) && die "--${name} takes no value"
      printf -v "${variable}" '%s' 1
    elif _contains "${name}" "${VALUE_FLAGS[@]}" "${LIST_FLAGS[@]}"; then
      if (( ! has_value )); then
        (( $# )) || die "--${name} needs a value"
        value="$1"
        shift
      fi
      if _contains "${name}" "${LIST_FLAGS[@]}"; then
        eval "${variable}+=(\"\${value}\")"
      else
        printf -v "${variable}" '%s' "${value}"
      fi
    else
      die "unknown flag --${name} (see --help)"
    fi
  done
}

# Fails naming the first of the given flags that has no value.
require() {
  local name variable
  for name in "$@"; do
    variable="$(_variable "${name}")"
    [[ -n "${!variable:-}" ]] || die "missing --${name} (see --help)"
  done
}

# Fails unless each named flag's value is a plain relative path (it is spliced into remote
# commands, where it must not need quoting).
require_plain_path() {
  local name variable
  for name in "$@"; do
    variable="$(_variable "${name}")"
    [[ "${!variable}" =~ ^[A-Za-z0-9_][A-Za-z0-9_./-]*$ ]] ||
      die "--${name} must be a relative path of letters, digits and _./-, got '${!variable}'"
  done
}

# The location flags every gcloud TPU command takes.
location_flags() {
  LOCATION=("--zone=${ZONE}")
  if [[ -n "${PROJECT:-}" ]]; then
    LOCATION+=("--project=${PROJECT}")
  fi
}

# Succeeds when the TPU VM (or, with --queued, the queued resource) NAME exists.
tpu_exists() {
  local kind=(tpu-vm)
  if (( ${QUEUED:-0} )); then
    kind=(queued-resources)
  fi
  gcloud compute tpus "${kind[@]}" describe "${NAME}" "${LOCATION[@]}" >/dev/null 2>&1
}
