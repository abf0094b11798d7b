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
# Inside the guest, four wires (veth pairs, MTU 9000, an rxe device on each
# end, policy routes so traffic between the two ends crosses the wire; each
# end is one "host"; scripts/guest/wire.sh NAME cuts, rate-limits or counts):
#   wire  listening end (addr dev netdev)     other end (addr dev netdev)
#   ab    A  10.77.0.1 rxe0 veth0             B      10.77.0.2 rxe1 veth1
#   c     C  10.77.1.1 rxe2 veth2             SRC_C  10.77.1.2 rxe3 veth3
#   d     D  10.77.2.1 rxe4 veth4             SRC_D  10.77.2.2 rxe5 veth5
#   ab2   A2 10.77.3.1 rxe6 veth6             B2     10.77.3.2 rxe7 veth7
# exported as RXFER_ADDR_<END>, RXFER_DEV_<END>, RXFER_NETDEV_<END> for END
# in A B A2 B2 C D; the upstream ends of C and D (the address a sender or a
# relay hop gives as --source to reach C or D) as RXFER_SRC_C, RXFER_SRC_D,
# RXFER_DEV_SRC_C, RXFER_NETDEV_SRC_C (and _D); RXFER_WIRES="ab c d ab2".
# A2/B2 is a second wire (rail) between "hosts" A and B. Also
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
  modprobe -a rdma_rxe rdma_ucm ib_uverbs veth sch_netem sch_tbf ||
    gfail "modprobe rdma_rxe rdma_ucm ib_uverbs veth sch_netem sch_tbf failed"

  # Several "hosts" in one kernel (rxe in 6.1 has no netns support): wire W
  # (0-3) is a veth pair veth<2W> (10.77.W.1, the listening end) and
  # veth<2W+1> (10.77.W.2), rxe<2W> and rxe<2W+1> on them. Policy routing
  # sends traffic between the two ends through the pair instead of `lo`, so
  # it really crosses the wire (netem and tbf there apply), in tables 100+2W
  # and 101+2W. The local-table rule moves from priority 0 to 1000; "iif lo"
  # keeps the rules to locally generated packets so received ones are still
  # delivered locally. Static neighbours: the first ARP exchange over the
  # policy routes can take 20-30 s, longer than rdma_cm waits. The commands
  # are built with builtins only: every fork costs ~0.1 s under TCG.
  local f w a b da db ta tb ma mb ea eb vb
  local ends=(A B C SRC_C D SRC_D A2 B2) names=(ab c d ab2)
  local links='' addrs='' ups='' rules='' routes='' neighs='' rxe='' env_wires=()
  for f in /proc/sys/net/ipv4/conf/{all,default}/{rp_filter,accept_local}; do
    [[ $f == */rp_filter ]] && echo 0 >"$f" || echo 1 >"$f"
  done
  for w in 0 1 2 3; do
    a=10.77.$w.1 b=10.77.$w.2 da=veth$((2 * w)) db=veth$((2 * w + 1))
    ta=$((100 + 2 * w)) tb=$((101 + 2 * w))
    ma=02:00:0a:4d:0$w:01 mb=02:00:0a:4d:0$w:02
    links+="link add $da address $ma mtu 9000 type veth peer name $db address $mb mtu 9000"$'\n'
    addrs+="addr add $a/24 dev $da"$'\n'"addr add $b/24 dev $db"$'\n'
    ups+="link set $da up"$'\n'"link set $db up"$'\n'
    rules+="rule add pref $ta iif lo from $a to $b lookup $ta"$'\n'
    rules+="rule add pref $tb iif lo from $b to $a lookup $tb"$'\n'
    routes+="route add $b dev $da src $a table $ta"$'\n'"route add $a dev $db src $b table $tb"$'\n'
    neighs+="neigh replace $b lladdr $mb dev $da nud permanent"$'\n'
    neighs+="neigh replace $a lladdr $ma dev $db nud permanent"$'\n'
    rxe+="link add rxe$((2 * w)) type rxe netdev $da"$'\n'"link add rxe$((2 * w + 1)) type rxe netdev $db"$'\n'
    # The other end of C's and D's wire is their upstream: RXFER_SRC_C.
    ea=${ends[2 * w]} eb=${ends[2 * w + 1]} vb=RXFER_ADDR_
    [[ $eb == SRC_* ]] && vb=RXFER_
    env_wires+=("RXFER_ADDR_$ea=$a" "$vb$eb=$b" "RXFER_DEV_$ea=rxe$((2 * w))" "RXFER_DEV_$eb=rxe$((2 * w + 1))"
      "RXFER_NETDEV_$ea=$da" "RXFER_NETDEV_$eb=$db")
  done
  env_wires+=("RXFER_WIRES=${names[*]}")
  ip -batch - <<EOF || gfail "veth / policy routing set-up failed"
${links}link set lo up
$addrs${ups}rule add pref 1000 lookup local
rule del pref 0 lookup local
$rules$routes${neighs%$'\n'}
EOF
  for f in /proc/sys/net/ipv4/conf/veth[0-7]/{rp_filter,accept_local}; do
    [[ $f == */rp_filter ]] && echo 0 >"$f" || echo 1 >"$f"
  done
  rdma -b - <<<"$rxe" || gfail "rdma link add failed"
  # Bounded wait (~20 s guest time) for every port to be ACTIVE and to have
  # its IPv4 RoCEv2 GID (index 1, ::ffff:10.77.W.E); builtins only.
  local i d st g missing
  for ((i = 0; i < 200; i++)); do
    missing=''
    for d in 0 1 2 3 4 5 6 7; do
      rd st /sys/class/infiniband/rxe$d/ports/1/state
      rd g /sys/class/infiniband/rxe$d/ports/1/gids/1
      [[ $st == *ACTIVE* && $g == *:ffff:0a4d:0$((d / 2))0$((d % 2 + 1)) ]] ||
        missing+=" rxe$d: state '$st' gid 1 '$g';"
    done
    [[ -z $missing ]] && break
    sleep 0.1
  done
  [[ -z $missing ]] || gfail "rxe ports not ACTIVE with their IPv4 GID after 20 s:$missing"
  ulimit -l unlimited || gfail "ulimit -l unlimited"
  ulimit -n 65536 2>/dev/null
  echo "rxfer-guest: set-up done (uptime $(</proc/uptime)); running command"

  # shellcheck source=/dev/null
  . "$io/env.sh" || gfail "cannot read env.sh"
  cd "$HOST_PWD" || gfail "cannot cd to $HOST_PWD"
  local rc
  env -i "${GUEST_ENV[@]}" \
    "${env_wires[@]}" RDMA_XFER_REQUIRE_RDMA=1 IN_RXFER_GUEST=1 \
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
ARGS=("$@")
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
# A guest kernel that panicked while booting, before the command printed
# anything (seen once with 6.12 under TCG: an int3 oops in an initcall),
# is booted again, once: the command never ran.
if [[ ${RXFER_GUEST_REBOOTED:-0} != 1 && ! -s $IO/stdout && ! -s $IO/stderr ]] &&
  grep -q 'Kernel panic' "$CONSOLE" 2>/dev/null; then
  echo "run.sh: the guest kernel panicked before the command started: booting it again (once)" >&2
  cleanup
  trap - EXIT
  RXFER_GUEST_REBOOTED=1 exec "$SELF" "${ARGS[@]}"
fi
exit 125
