#!/usr/bin/env bash
# Run a command inside a throw-away QEMU (TCG) guest with a real SoftRoCE
# stack: two rxe devices on the two ends of a veth pair (see
# /work/shared/SOFTROCE-VM.md for why this is needed and how it works).
#
# Usage: scripts/guest/run.sh [-k 6.1|6.12] [-m MEM_MiB] [-c CPUS] [-t TIMEOUT_S] [--] 'COMMAND STRING'
#   -k  the guest kernel: Debian 12's 6.1 (default) or Debian 13's 6.12
#       (default: $RXFER_GUEST_KERNEL, else 6.1; see prepare.sh)
#
# The guest's / is the host's / (read-only 9p) with a tmpfs overlay, so host
# binaries and target/ work at the same paths; guest writes vanish with it.
# The command runs as `bash -c 'COMMAND STRING'` in the host's current
# directory; its stdout/stderr stream to this script's stdout/stderr.
# Exit status: the command's; 124 if the guest ran past TIMEOUT_S; 125 if the
# guest could not be set up or died before the command finished.
#
# Inside the guest: RXFER_ADDR_A=10.77.0.1 RXFER_DEV_A=rxe0 RXFER_NETDEV_A=veth0
#   RXFER_ADDR_B=10.77.0.2 RXFER_DEV_B=rxe1 RXFER_NETDEV_B=veth1
#   RDMA_XFER_REQUIRE_RDMA=1 IN_RXFER_GUEST=1 RXFER_GUEST_KERNEL=6.1|6.12,
#   RXFER_SSHD_DIR (an unpacked sshd that tests start with
#   scripts/guest/sshd.sh),
#   plus PATH, HOME, CI (if set)
#   and any RXFER_*/RDMA_XFER_* variables of the host.
# Host env: RXFER_GUEST_KERNEL (see -k), RXFER_GUEST_DIR (cache dir),
#   RXFER_GUEST_CPU (QEMU -cpu model),
#   RXFER_GUEST_KEEP=1 (keep the per-run dir), RXFER_GUEST_ROOT_CACHE
#   (9p cache mode of the root share: loose (default) or none).
set -euo pipefail

ADDR_A=10.77.0.1 ADDR_B=10.77.0.2

# ================================================================ guest side
# PID 1 after switch_root (started by the initramfs /init).
guest_init() {
  local io=/run/rxfer-io
  exec >/dev/console 2>&1 </dev/null
  set +e
  export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  rd() { local -n _v=$1; _v=; [[ -r $2 ]] && read -r _v <"$2"; }
  gfail() {
    echo "rxfer-guest: SET-UP FAILED: $*"
    printf '%s\n' "$*" >>"$io/setup_error"
    echo o >/proc/sysrq-trigger
    sleep 10
    exit 1
  }
  # shellcheck source=/dev/null
  . "$io/boot.conf" || gfail "cannot read boot.conf"
  echo "rxfer-guest: set-up starting (uptime $(</proc/uptime))"
  hostname rxfer-guest 2>/dev/null
  modprobe -a rdma_rxe rdma_ucm ib_uverbs veth sch_netem ||
    gfail "modprobe rdma_rxe rdma_ucm ib_uverbs veth sch_netem failed"

  # Two "hosts" in one kernel (rxe in 6.1 has no netns support): policy
  # routing sends A<->B traffic through the veth pair instead of `lo`, so it
  # really crosses the wire and netem on veth1 applies. The local-table rule
  # moves from priority 0 to 1000; "iif lo" keeps the rules to locally
  # generated packets so received ones are still delivered locally.
  local f
  for f in /proc/sys/net/ipv4/conf/{all,default}/{rp_filter,accept_local}; do
    [[ $f == */rp_filter ]] && echo 0 >"$f" || echo 1 >"$f"
  done
  ip -batch - <<EOF || gfail "veth / policy routing set-up failed"
link add veth0 address 02:00:0a:4d:00:01 mtu 9000 type veth peer name veth1 address 02:00:0a:4d:00:02 mtu 9000
link set lo up
addr add $ADDR_A/24 dev veth0
addr add $ADDR_B/24 dev veth1
link set veth0 up
link set veth1 up
rule add pref 1000 lookup local
rule del pref 0 lookup local
rule add pref 100 iif lo from $ADDR_A to $ADDR_B lookup 100
rule add pref 101 iif lo from $ADDR_B to $ADDR_A lookup 101
route add $ADDR_B dev veth0 src $ADDR_A table 100
route add $ADDR_A dev veth1 src $ADDR_B table 101
neigh replace $ADDR_B lladdr 02:00:0a:4d:00:02 dev veth0 nud permanent
neigh replace $ADDR_A lladdr 02:00:0a:4d:00:01 dev veth1 nud permanent
EOF
  for f in /proc/sys/net/ipv4/conf/veth{0,1}/{rp_filter,accept_local}; do
    [[ $f == */rp_filter ]] && echo 0 >"$f" || echo 1 >"$f"
  done
  rdma -b - <<EOF || gfail "rdma link add failed"
link add rxe0 type rxe netdev veth0
link add rxe1 type rxe netdev veth1
EOF
  # Bounded wait (~20 s guest time) for both ports to be ACTIVE and to have
  # their IPv4 RoCEv2 GID (index 1); builtins only, forks are slow here.
  local i st0 st1 g0 g1
  for ((i = 0; i < 200; i++)); do
    rd st0 /sys/class/infiniband/rxe0/ports/1/state
    rd st1 /sys/class/infiniband/rxe1/ports/1/state
    rd g0 /sys/class/infiniband/rxe0/ports/1/gids/1
    rd g1 /sys/class/infiniband/rxe1/ports/1/gids/1
    [[ $st0 == *ACTIVE* && $st1 == *ACTIVE* && $g0 == *:ffff:0a4d:0001 && $g1 == *:ffff:0a4d:0002 ]] && break
    sleep 0.1
  done
  [[ $st0 == *ACTIVE* && $st1 == *ACTIVE* ]] ||
    gfail "rxe ports not ACTIVE after 20 s: rxe0='$st0' rxe1='$st1'"
  [[ $g0 == *:ffff:0a4d:0001 && $g1 == *:ffff:0a4d:0002 ]] ||
    gfail "rxe IPv4 GIDs (index 1) missing: rxe0='$g0' rxe1='$g1'"
  ulimit -l unlimited || gfail "ulimit -l unlimited"
  ulimit -n 65536 2>/dev/null
  echo "rxfer-guest: set-up done (uptime $(</proc/uptime)); running command"

  # shellcheck source=/dev/null
  . "$io/env.sh" || gfail "cannot read env.sh"
  cd "$HOST_PWD" || gfail "cannot cd to $HOST_PWD"
  local rc
  env -i "${GUEST_ENV[@]}" \
    RXFER_ADDR_A=$ADDR_A RXFER_ADDR_B=$ADDR_B RXFER_DEV_A=rxe0 RXFER_DEV_B=rxe1 \
    RXFER_NETDEV_A=veth0 RXFER_NETDEV_B=veth1 RDMA_XFER_REQUIRE_RDMA=1 \
    IN_RXFER_GUEST=1 \
    bash -c "$(<"$io/cmd")" </dev/null >>"$io/stdout" 2>>"$io/stderr"
  rc=$?
  echo "rxfer-guest: command exited $rc (uptime $(</proc/uptime))"
  echo "$rc" >"$io/status.tmp" && mv "$io/status.tmp" "$io/status"
  sync
  echo o >/proc/sysrq-trigger
  sleep 10
  exit 0
}

if [[ ${1:-} == --guest-init ]]; then
  guest_init
fi

# ================================================================ host side
usage() {
  sed -n '6,8p' "${BASH_SOURCE[0]}" | sed 's/^# //' >&2
  exit 2
}
MEM=4096 CPUS=2 TIMEOUT=3600 KSEL=${RXFER_GUEST_KERNEL:-6.1}
while [[ $# -gt 0 ]]; do
  case $1 in
    -k) KSEL=$2; shift 2 ;;
    -m) MEM=$2; shift 2 ;;
    -c) CPUS=$2; shift 2 ;;
    -t) TIMEOUT=$2; shift 2 ;;
    -h | --help) usage ;;
    --) shift; break ;;
    -*) usage ;;
    *) break ;;
  esac
done
[[ $# -ge 1 ]] || usage
CMD="$*"
[[ $MEM =~ ^[0-9]+$ && $CPUS =~ ^[0-9]+$ && $TIMEOUT =~ ^[0-9]+$ ]] || usage

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
SCRIPT_DIR=${SELF%/*}
REPO=$(cd "$SCRIPT_DIR/../.." && pwd)

# The guest mounts fresh tmpfs on /tmp, /run, /dev/shm: host files there are
# invisible to it. A checkout under /tmp (a CI clone, say) is bind-mounted
# back (read-only) at its own path; any other hidden directory cannot work.
SHOW_HOST_DIR=
[[ $REPO/ == /tmp/* ]] && SHOW_HOST_DIR=$REPO
case $PWD/ in
  "$REPO"/*) ;;
  /tmp/* | /run/* | /dev/* | /proc/* | /sys/*)
    echo "run.sh: current directory $PWD is hidden inside the guest (tmpfs/pseudo-fs there); run from elsewhere (e.g. /var/tmp)" >&2
    exit 125 ;;
esac
GDIR=${RXFER_GUEST_DIR:-$REPO/target/guest}
export RXFER_GUEST_DIR=$GDIR RXFER_GUEST_KERNEL=$KSEL

"$SCRIPT_DIR/prepare.sh" -q -k "$KSEL" || { echo "run.sh: prepare.sh -k $KSEL failed" >&2; exit 125; }
# An sshd for the tests of the one-command form to start (tests/rdma/ssh.rs).
export RXFER_SSHD_DIR=$GDIR/openssh
"$SCRIPT_DIR/sshd.sh" prepare "$RXFER_SSHD_DIR" || { echo "run.sh: sshd.sh prepare failed" >&2; exit 125; }
# shellcheck source=/dev/null
. "$GDIR/$KSEL/current.env"

# Per-run dir: console log, QEMU log and the writable 9p share "io".
mkdir -p "$GDIR/runs"
RUN=$(mktemp -d "$GDIR/runs/run.XXXXXX")
IO=$RUN/io
mkdir "$IO"
: >"$IO/stdout"
: >"$IO/stderr"
printf '%s' "$CMD" >"$IO/cmd"

sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
{
  echo "ROOT_CACHE=${RXFER_GUEST_ROOT_CACHE:-loose}"
  echo "KVER=$(sq "$KVER")"
  echo "MODDIR=$(sq "$MODDIR")"
  echo "GUEST_INIT=$(sq "$SELF")"
  echo "SHOW_HOST_DIR=$(sq "$SHOW_HOST_DIR")"
} >"$IO/boot.conf"

# Environment for the command: PATH as on the host (with ~/.cargo/bin),
# HOME, CI and a few build/test variables, plus RXFER_*/RDMA_XFER_* vars.
GPATH=$PATH
[[ -d ${HOME:-/root}/.cargo/bin && ":$GPATH:" != *":${HOME:-/root}/.cargo/bin:"* ]] &&
  GPATH=${HOME:-/root}/.cargo/bin:$GPATH
{
  echo "HOST_PWD=$(sq "$PWD")"
  echo "GUEST_ENV=("
  echo "  $(sq "PATH=$GPATH")"
  echo "  $(sq "HOME=${HOME:-/root}")"
  echo "  $(sq "TERM=dumb")"
  while IFS= read -r v; do
    case $v in
      CI | USER | LOGNAME | LANG | LC_ALL | RUST_BACKTRACE | RUST_LOG | RUSTUP_HOME | \
        RUSTUP_TOOLCHAIN | CARGO_HOME | CARGO_TARGET_DIR | CARGO_TERM_COLOR | \
        RXFER_* | RDMA_XFER_* | NEXTEST_*)
        echo "  $(sq "$v=${!v}")" ;;
    esac
  done < <(compgen -e)
  echo ")"
} >"$IO/env.sh"

CONSOLE=$RUN/console.log
QLOG=$RUN/qemu.log
CPU=${RXFER_GUEST_CPU:-qemu64}
QPID='' TPIDS=()
# Extra QEMU arguments for experiments (word-split on purpose).
read -ra QEXTRA <<<"${RXFER_GUEST_QEMU_EXTRA:-}"

# shellcheck disable=SC2317  # invoked from the EXIT trap
cleanup() {
  local p
  [[ -n $QPID ]] && kill "$QPID" 2>/dev/null
  for p in "${TPIDS[@]}"; do kill "$p" 2>/dev/null; done
  if [[ ${RXFER_GUEST_KEEP:-0} != 1 ]]; then
    rm -rf "$IO"
  fi
  # Keep the 20 newest finished run dirs (their console logs help
  # debugging). A dir that still has io/ may belong to a running guest:
  # only remove it when it is more than two days old.
  find "$GDIR/runs" -mindepth 1 -maxdepth 1 -type d ! -exec test -d '{}/io' ';' \
    -printf '%T@ %p\n' 2>/dev/null |
    sort -rn | tail -n +21 | cut -d' ' -f2- | while read -r d; do rm -rf "$d"; done
  find "$GDIR/runs" -mindepth 1 -maxdepth 1 -type d -mtime +2 -exec rm -rf '{}' + 2>/dev/null
  return 0
}
trap cleanup EXIT
trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM

# -cpu qemu64 (not max: memcpy ~9x slower under TCG with max); no KVM here.
qemu-system-x86_64 -accel tcg,thread=multi -machine pc -cpu "$CPU" \
  -smp "$CPUS" -m "$MEM" -nodefaults -no-user-config -display none \
  -no-reboot -monitor none -serial "file:$CONSOLE" \
  -kernel "$KERNEL" -initrd "$INITRD" \
  -append "console=ttyS0 quiet panic=-1 8250.nr_uarts=1 tsc=reliable ${RXFER_GUEST_APPEND:-}" \
  -virtfs "local,path=/,mount_tag=rxroot,security_model=none,readonly=on,multidevs=remap" \
  -virtfs "local,path=$IO,mount_tag=rxio,security_model=none,multidevs=remap" \
  "${QEXTRA[@]}" </dev/null >"$QLOG" 2>&1 &
QPID=$!

# Stream the command's output live; --pid makes tail do a final read after
# QEMU exits (polling mode: inotify would not be needed, keep it simple).
tail -c +1 -s 0.2 ---disable-inotify --pid="$QPID" -f "$IO/stdout" &
TPIDS+=($!)
tail -c +1 -s 0.2 ---disable-inotify --pid="$QPID" -f "$IO/stderr" >&2 &
TPIDS+=($!)

print_console_tail() {
  echo "---- last 40 lines of guest console ($CONSOLE) ----" >&2
  tail -n 40 "$CONSOLE" >&2 2>/dev/null || true
  if [[ -s $QLOG ]]; then
    echo "---- QEMU output ($QLOG) ----" >&2
    tail -n 20 "$QLOG" >&2
  fi
}

TIMED_OUT=0
DEADLINE=$((SECONDS + TIMEOUT))
while kill -0 "$QPID" 2>/dev/null; do
  if ((SECONDS >= DEADLINE)); then
    TIMED_OUT=1
    kill "$QPID" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$QPID" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$QPID" 2>/dev/null || true
    break
  fi
  sleep 0.2
done
wait "$QPID" 2>/dev/null || true
QPID=''
# Let the tails do their final read, then reap them.
for p in "${TPIDS[@]}"; do wait "$p" 2>/dev/null || true; done
TPIDS=()

if [[ $TIMED_OUT == 1 ]]; then
  echo "run.sh: TIMEOUT: guest still running after ${TIMEOUT}s; QEMU killed" >&2
  print_console_tail
  exit 124
fi
if [[ -f $IO/status ]]; then
  rc=$(<"$IO/status")
  [[ $rc =~ ^[0-9]+$ ]] || rc=125
  exit "$rc"
fi
if [[ -s $IO/setup_error ]]; then
  echo "run.sh: guest set-up failed: $(<"$IO/setup_error")" >&2
else
  echo "run.sh: guest exited without reporting the command's status" >&2
fi
print_console_tail
exit 125
