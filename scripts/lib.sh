# shellcheck shell=bash
# Shared helpers of the scripts; source it, don't run it:
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"      (from scripts/)
# Three groups:
#   rx_apt_*   idempotent, non-interactive Debian package installation
#              (scripts/install-deps.sh, scripts/guest/prepare.sh);
#   rx_size_runs_opts, rx_ib_write_bw: the benchmarks' options and baseline
#              (scripts/bench.sh, scripts/bench-tune.sh);
#   rx_xfer_*  one sender -> receiver transfer where RDMA exists
#              (scripts/transfer.sh, scripts/small-files.sh).
# Every name it defines starts with rx_ / RX_, so it cannot clash with the
# sourcing script's own.

# ------------------------------------------------------------------ generic
# Prints the script's leading comment block (after the #! line, up to the
# first line that is not a comment) without the "# ", on stderr; exits $1.
rx_usage() {
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" >&2
  exit "${1:-2}"
}

# Wall-clock time in microseconds, into the variable named $1. A builtin
# ($EPOCHREALTIME): spawning `date` costs ~0.1 s in the TCG guest and would
# land inside the measurement.
rx_now_us() {
  local -n _rx_t=$1
  local t=${EPOCHREALTIME/[.,]/}
  _rx_t=$((10#$t))
}

# ------------------------------------------------------------------ apt
RX_APT_UPDATED=0
RX_SUDO=()
if [[ $(id -u) != 0 ]] && command -v sudo >/dev/null; then
  RX_SUDO=(sudo -n)
fi

rx_apt_say() { echo "${RX_APT_WHO:-install-deps}: $*" >&2; }

# Prints, one a line, those of the given packages that are not installed.
# One dpkg-query call (fast path); packages dpkg doesn't know print nothing.
rx_apt_missing() {
  dpkg-query -W -f='${Package} ${Status}\n' "$@" 2>/dev/null |
    awk -v want="$*" '
      $2 == "install" && $3 == "ok" && $4 == "installed" { ok[$1] = 1 }
      END { n = split(want, w, " "); for (i = 1; i <= n; i++) if (!(w[i] in ok)) print w[i] }'
}

# Root, or sudo that asks for no password (-n: a build must never stop at a
# prompt, nor fail later with sudo's own message).
rx_apt_can_install() {
  [[ $(id -u) == 0 ]] || { [[ ${#RX_SUDO[@]} -gt 0 ]] && sudo -n true 2>/dev/null; }
}

# `apt-get update`, at most once per script run.
rx_apt_update_once() {
  [[ $RX_APT_UPDATED == 1 ]] && return 0
  rx_apt_say "apt-get update"
  "${RX_SUDO[@]}" apt-get update -qq </dev/null >&2 || { rx_apt_say "apt-get update failed"; return 1; }
  RX_APT_UPDATED=1
}

# Installs those of the given packages that are missing. Touches apt only
# when something is missing; one retry after `dpkg --configure -a` (a dpkg
# hiccup on a fresh machine's first install was seen once). Returns 1 if
# they could not be installed (without root: saying what to run), 2 on a
# system without dpkg, where nothing can be checked.
rx_apt_install() {
  local todo attempt
  if ! command -v dpkg-query >/dev/null; then
    rx_apt_say "not a Debian-based system (no dpkg-query): cannot check for nor install: $*"
    return 2
  fi
  mapfile -t todo < <(rx_apt_missing "$@")
  [[ ${#todo[@]} -eq 0 ]] && return 0
  if ! rx_apt_can_install; then
    rx_apt_say "missing packages: ${todo[*]}"
    rx_apt_say "installing them needs root (or sudo without a password); run"
    rx_apt_say "  sudo apt-get install ${todo[*]}"
    rx_apt_say "and then this again"
    return 1
  fi
  rx_apt_update_once || return 1
  rx_apt_say "installing: ${todo[*]}"
  for attempt in 1 2; do
    if "${RX_SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${todo[@]}" </dev/null >&2; then
      return 0
    fi
    rx_apt_say "apt-get install failed (attempt $attempt)"
    "${RX_SUDO[@]}" env DEBIAN_FRONTEND=noninteractive dpkg --configure -a </dev/null >&2 || true
    sleep 2
  done
  rx_apt_say "could not install: ${todo[*]}"
  return 1
}

# ------------------------------------------------------------------ benchmarks
# Parses the common `-s SIZE_MiB -r RUNS` options of the benchmark scripts
# and scripts/transfer.sh into SIZE_MIB and RUNS (their defaults set by the
# caller; no check of the values); anything else prints the usage and
# exits 2.
# shellcheck disable=SC2034  # SIZE_MIB and RUNS are the caller's
rx_size_runs_opts() {
  local o OPTIND=1
  while getopts 's:r:h' o; do
    case $o in
      s) SIZE_MIB=$OPTARG ;;
      r) RUNS=$OPTARG ;;
      *) rx_usage 2 ;;
    esac
  done
}

# ib_write_bw's throughput in MiB/s (scripts/guest/ib-write-bw.sh with the
# given options; inside the guest); exits 1 if it gave none.
rx_ib_write_bw() {
  local v
  v=$("$(dirname "${BASH_SOURCE[0]}")/guest/ib-write-bw.sh" "$@" | sed -n 's/^ib_write_bw_MiBps=//p')
  [[ -n $v ]] || { echo "${0##*/}: ib_write_bw gave no result" >&2; exit 1; }
  echo "$v"
}

# ------------------------------------------------------------------ transfers
# Sets the transfer environment from RXFER_* variables (run.sh exports them
# in the guest):
#   RX_BIN      directory of sender and receiver (RXFER_BIN_DIR, default
#               <repo>/target/release)
#   RX_A        the receiver's address (RXFER_ADDR_A, required)
#   RX_SOURCE   (--source RXFER_ADDR_B) when set: the sender's side of the wire
#   RX_PORT     RXFER_PORT, default $1
#   RX_WORK     a fresh work directory (prefix $2), removed on exit together
#               with a receiver still running
rx_xfer_init() {
  local default_port=$1 prefix=$2 root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  RX_BIN=${RXFER_BIN_DIR:-$root/target/release}
  RX_A=${RXFER_ADDR_A:?set RXFER_ADDR_A (receiver address) or run inside the guest}
  RX_SOURCE=()
  [[ -n ${RXFER_ADDR_B:-} ]] && RX_SOURCE=(--source "$RXFER_ADDR_B")
  RX_PORT=${RXFER_PORT:-$default_port}
  # tmpfs when possible (the guest's /tmp), so the disk does not limit it.
  RX_WORK=$(mktemp -d "${TMPDIR:-/tmp}/$prefix.XXXXXX")
  RX_RPID=
  trap rx_xfer_cleanup EXIT
}

# shellcheck disable=SC2317  # invoked from the EXIT trap
rx_xfer_cleanup() {
  [[ -n ${RX_RPID:-} ]] && kill "$RX_RPID" 2>/dev/null
  [[ -n ${RX_WORK:-} ]] && rm -rf "$RX_WORK"
  return 0
}

# Starts `receiver --once --bind RX_A --port RX_PORT "$@"` in the background
# with its stderr in $RX_WORK/receiver.log (stdin and stdout closed) and
# waits (bounded, 30 s) until it listens. Sets RX_RPID. Without
# --token-file in "$@" the receiver runs --insecure: these transfers run
# on a private link (SoftRoCE on this host, or the guest's veth wire) and
# measure the unauthenticated path (a token makes sha256 the digest).
rx_start_receiver() {
  local w auth=(--insecure) a
  for a in "$@"; do [[ $a == --token-file ]] && auth=(); done
  "$RX_BIN/receiver" --once --bind "$RX_A" --port "$RX_PORT" "${auth[@]}" "$@" \
    </dev/null >/dev/null 2>"$RX_WORK/receiver.log" &
  RX_RPID=$!
  for ((w = 0; w < 600; w++)); do
    grep -q listening "$RX_WORK/receiver.log" && return 0
    kill -0 "$RX_RPID" 2>/dev/null || break
    sleep 0.05
  done
  echo "receiver did not start listening:" >&2
  cat "$RX_WORK/receiver.log" >&2
  exit 1
}

# Runs `sender [--source B] --port RX_PORT "$@"` (stderr in
# $RX_WORK/sender.log), then waits for the receiver; on either failing
# prints both logs and exits 1. Sets RX_TOOK_US to the sender's wall time
# (process start to its exit after the receiver's ACK).
rx_send_timed() {
  local t0 t1
  rx_now_us t0
  if ! "$RX_BIN/sender" "${RX_SOURCE[@]}" --port "$RX_PORT" "$@" \
      </dev/null >/dev/null 2>"$RX_WORK/sender.log"; then
    echo "sender failed:" >&2
    cat "$RX_WORK/sender.log" "$RX_WORK/receiver.log" >&2
    exit 1
  fi
  rx_now_us t1
  if ! wait "$RX_RPID"; then
    RX_RPID=
    echo "receiver failed:" >&2
    cat "$RX_WORK/receiver.log" >&2
    exit 1
  fi
  RX_RPID=
  # shellcheck disable=SC2034  # read by the sourcing script
  RX_TOOK_US=$((t1 - t0))
}
