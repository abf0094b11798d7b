#!/usr/bin/env bash
# An ssh server inside the SoftRoCE test guest, for the one-command form
# (`sender FILE HOST:DIR` starts its receiver over ssh).
#
# Usage: scripts/guest/sshd.sh prepare DIR
#          (host) unpacks Debian's openssh-server and libwrap0 into DIR
#          with dpkg -x: nothing is installed on the host and no daemon
#          starts there. Idempotent; fast once done.
#        scripts/guest/sshd.sh start DIR ADDR...
#          (guest, root; tests/rdma/ssh.rs, under a stock 8 MiB memlock limit)
#          starts that sshd, unless it runs already, listening on each ADDR, key
#          log-in only; root gets a key, authorized_keys, known_hosts for
#          every ADDR, and an ssh config with BatchMode (no prompts). The
#          test user `rxfer` (uid 4242) gets the same, and root may log in
#          as rxfer with its own key.
set -euo pipefail

die() { echo "sshd.sh: $*" >&2; exit 1; }

prepare() {
  local dir=$1 dl
  [[ -f $dir/.unpacked ]] && return 0
  # shellcheck source=scripts/lib.sh
  . "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
  RX_APT_WHO=sshd
  mkdir -p "$dir"
  dl=$(mktemp -d "$dir.dl.XXXXXX")
  if ! (cd "$dl" && apt-get download -q -o APT::Sandbox::User=root openssh-server libwrap0 \
    </dev/null >"$dl/log" 2>&1); then
    rx_apt_update_once || die "apt-get update failed"
    (cd "$dl" && apt-get download -q -o APT::Sandbox::User=root openssh-server libwrap0 \
      </dev/null >"$dl/log" 2>&1) || { cat "$dl/log" >&2; rm -rf "$dl"; die "apt-get download failed"; }
  fi
  local deb
  for deb in "$dl"/*.deb; do dpkg -x "$deb" "$dir"; done
  rm -rf "$dl"
  [[ -x $dir/usr/sbin/sshd ]] || die "no usr/sbin/sshd in the unpacked package"
  touch "$dir/.unpacked"
}

# Keys, authorized_keys, known_hosts and config for one user.
user_keys() {
  local home=$1 owner=$2 hostkey=$3
  shift 3
  mkdir -p "$home/.ssh"
  chmod 700 "$home/.ssh"
  [[ -f $home/.ssh/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -f "$home/.ssh/id_ed25519"
  # Its own key, and root's: root's tests log in as this user too.
  cat "$home/.ssh/id_ed25519.pub" /root/.ssh/id_ed25519.pub 2>/dev/null | sort -u >"$home/.ssh/authorized_keys"
  local a
  : >"$home/.ssh/known_hosts"
  for a in "$@"; do echo "$a $(<"$hostkey.pub")" >>"$home/.ssh/known_hosts"; done
  printf 'Host *\n  BatchMode yes\n  ConnectTimeout 20\n' >"$home/.ssh/config"
  chown -R "$owner" "$home/.ssh"
}

start() {
  local dir=$1 conf=/etc/rxfer-sshd a
  shift
  [[ -x $dir/usr/sbin/sshd ]] || die "no sshd under $dir (run: sshd.sh prepare $dir)"
  if [[ -f /run/rxfer-sshd.pid ]] && kill -0 "$(</run/rxfer-sshd.pid)" 2>/dev/null; then
    return 0
  fi
  grep -q '^sshd:' /etc/passwd || echo 'sshd:x:101:65534::/run/sshd:/usr/sbin/nologin' >>/etc/passwd
  grep -q '^rxfer:' /etc/passwd || {
    echo 'rxfer:x:4242:4242::/home/rxfer:/bin/bash' >>/etc/passwd
    echo 'rxfer:x:4242:' >>/etc/group
  }
  mkdir -p /run/sshd "$conf" /home/rxfer
  chmod 755 /run/sshd
  chown 4242:4242 /home/rxfer
  [[ -f $conf/host_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -f "$conf/host_ed25519"
  {
    for a in "$@"; do echo "ListenAddress $a"; done
    echo "HostKey $conf/host_ed25519"
    echo "PidFile /run/rxfer-sshd.pid"
    echo "PermitRootLogin prohibit-password"
    echo "PasswordAuthentication no"
    echo "KbdInteractiveAuthentication no"
    echo "UsePAM no"
    echo "AuthorizedKeysFile .ssh/authorized_keys"
    echo "MaxStartups 64"
    echo "MaxSessions 64"
    echo "LogLevel ERROR"
  } >"$conf/sshd_config"
  user_keys /root root "$conf/host_ed25519" "$@"
  user_keys /home/rxfer 4242:4242 "$conf/host_ed25519" "$@"
  LD_LIBRARY_PATH=$dir/usr/lib/x86_64-linux-gnu:$dir/lib/x86_64-linux-gnu \
    "$dir/usr/sbin/sshd" -f "$conf/sshd_config" -E /run/rxfer-sshd.log ||
    die "sshd did not start: $(cat /run/rxfer-sshd.log 2>/dev/null)"
}

case ${1:-} in
  prepare) [[ $# == 2 ]] || die "usage: sshd.sh prepare DIR"; prepare "$2" ;;
  start) [[ $# -ge 3 ]] || die "usage: sshd.sh start DIR ADDR..."; shift; start "$@" ;;
  *) die "usage: sshd.sh prepare DIR | start DIR ADDR..." ;;
esac
