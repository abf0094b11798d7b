# rdma-xfer — see README.md. On a fresh Debian 12 machine (root) `make demo`
# and `make test` install what they need (apt-get), build, and use SoftRoCE:
# on this host if it has RDMA, else inside a QEMU guest (scripts/guest/).
SHELL := /bin/bash
CARGO ?= cargo
PREFIX ?= /usr/local
# Where `make build` puts the release binaries (what `make install` installs).
RELEASE_DIR ?= target/release
# rdma-sys 0.3 uses bindgen 0.59, which needs libclang 14 (breaks with >= 16).
export LIBCLANG_PATH ?= /usr/lib/llvm-14/lib
# The commit `--version` names (empty outside a git checkout).
export RXFER_GIT_COMMIT ?= $(shell git describe --always --dirty --abbrev=12 --exclude='*' 2>/dev/null)
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: all deps lint-deps build lint unit fuzz e2e test demo bench bench-peers bench-sinks bench-tune bench-native build-bins install uninstall deb deb-root clean

all: build

# The Rust toolchain and the build packages only (apt is not touched when
# they are installed). The SoftRoCE guest (its host packages and kernels) is
# prepared by scripts/guest/run.sh, only by the targets that boot it (e2e,
# demo, bench) and only on a host without RDMA of its own.
deps:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust from https://rustup.rs" >&2; exit 1; }
	scripts/install-deps.sh --build

lint-deps: deps
	scripts/install-deps.sh --lint

# The fault-injection build (test-only switches, and the rxfer-raw-client
# binary of tests/rdma/hostile.rs) goes to its own target dir so that release
# binaries never contain it.
build: deps
	$(CARGO) build --release --locked --all-targets
	$(CARGO) build --release --locked --features fault-injection --target-dir target/fault-injection --bins

# shellcheck over every shell script under scripts/ (recursively), including
# the sourced scripts/lib.sh; -x follows the `source` directives.
lint: lint-deps
	find scripts .ci -type f \( -name '*.sh' -o -name run \) -print0 | sort -z | xargs -0 shellcheck -x
	scripts/lint-unsafe.sh
	scripts/check-architecture.sh
	$(CARGO) fmt --check
	$(CARGO) clippy --release --locked --all-targets -- -D warnings
	$(CARGO) clippy --release --locked --features fault-injection --target-dir target/fault-injection --all-targets -- -D warnings

# Pure logic and CLI tests on this host (no RDMA needed); tests/install.rs
# also needs systemd-analyze and groff (install-deps.sh --unit).
unit: build
	scripts/install-deps.sh --unit
	$(CARGO) test --release --locked --lib --bins --test cli --test fuzz_proto --test compile_fail --test install

# Long property-based fuzzing of the codec and both session state machines
# (tests/fuzz_proto/; `make unit` runs the same properties briefly):
# 4 decoder properties (sealed messages included) and the protocol 3
# handshake (relays, other tokens, downgrades, mangled or foreign proofs)
# x FUZZ_DECODE_CASES + 2 state-machine properties x FUZZ_MACHINE_CASES
# sessions (each a sequence of up to 300 events, ~15 million events per
# property) = 5.2 million generated cases by default, 5-6 min on 1 core.
# Each property prints its case/input counts.
FUZZ_DECODE_CASES ?= 1000000
FUZZ_MACHINE_CASES ?= 100000
fuzz: deps
	PROPTEST_CASES=$(FUZZ_DECODE_CASES) $(CARGO) test --release --locked --test fuzz_proto -- --nocapture --test-threads=1 decode_
	PROPTEST_CASES=$(FUZZ_DECODE_CASES) $(CARGO) test --release --locked --test fuzz_proto -- --nocapture --test-threads=1 handshake_
	PROPTEST_CASES=$(FUZZ_MACHINE_CASES) $(CARGO) test --release --locked --test fuzz_proto -- --nocapture --test-threads=1 machine_

# The end-to-end suite on real RDMA: this host if it has RDMA, else the
# SoftRoCE guest, once per kernel in RXFER_GUEST_KERNELS (default "6.1 6.12",
# one boot each; see scripts/e2e.sh).
# (tests/rdma/deb.rs installs the .deb in the guest, and transfers with it
# from a clean Debian 12 root: `make deb` and `make deb-root` first.)
e2e: build deb-root
	scripts/e2e.sh

test: lint unit e2e

demo: build
	scripts/demo.sh

bench: build
	scripts/guest/run.sh -t 3600 'scripts/bench.sh'

# The peers (docs/performance.md#the-peers): the same 256 MiB file B -> A
# with scp, rsync over ssh, a netcat pipe, rdma-core's rcopy and rdma-xfer,
# median of 3 each, in one guest boot. rsync and netcat are installed on
# this host (apt, only when missing): the guest's / is this host's.
bench-peers: build
	@. scripts/lib.sh && RX_APT_WHO=bench-peers rx_apt_install rsync netcat-openbsd
	@echo "host before: $$(uptime)"
	RXFER_HOST_UPTIME="$$(uptime)" scripts/guest/run.sh -t 3600 'scripts/bench-peers.sh'
	@echo "host after: $$(uptime)"

# Disk or network (docs/performance.md#disk-or-network): the same 1 GiB
# into tmpfs, onto a disk (a sparse image under target/ as a virtio disk,
# ext4) and with receiver --discard.
bench-sinks: build
	rm -f target/bench-disk.img && truncate -s 4G target/bench-disk.img
	RXFER_GUEST_QEMU_EXTRA="-drive file=$(CURDIR)/target/bench-disk.img,if=virtio,format=raw,cache=none" \
	  scripts/guest/run.sh -t 3600 'modprobe virtio_blk && mkfs.ext4 -q -F /dev/vda && \
	    mkdir -p /mnt/disk && mount /dev/vda /mnt/disk && \
	    RXFER_BENCH_DISK=/mnt/disk RXFER_BENCH_PARTS=sinks scripts/bench.sh'
	rm -f target/bench-disk.img

# The tuning table of docs/performance.md (chunk size x depth x CQ
# waiting: throughput and CPU per GiB), in the guest.
bench-tune: build
	scripts/guest/run.sh -t 3600 'scripts/bench-tune.sh'

# Each side's per-byte CPU cost on this host at native speed, next to
# memcpy, CRC32, SHA-256, pread and pwrite, and lanes: one file by 1 and 2
# threads a side, into tmpfs and into ext4 (buffered, O_DIRECT)
# (benches/per_byte.rs, about a minute): no RDMA and no guest, whose
# emulation hides these costs. Files go to /dev/shm (RXFER_BENCH_DIR to
# change) and an ext4 on a loop device (scripts/bench-native.sh). See
# docs/performance.md.
bench-native: deps
	CARGO=$(CARGO) scripts/bench-native.sh

# Binaries, man pages (share/man/man1), bash/zsh/fish completions and the
# receiver's systemd unit (never enabled), all under $(DESTDIR)$(PREFIX);
# see scripts/install.sh. No root needed for a PREFIX of one's own
# (PREFIX=~/.local) once the build packages are there.
# Only the release binaries (not the tests or the fault-injection build).
build-bins: deps
	$(CARGO) build --release --locked --bins

install: build-bins
	DESTDIR='$(DESTDIR)' PREFIX='$(PREFIX)' scripts/install.sh '$(RELEASE_DIR)'

# The Debian package, target/deb/rdma-xfer_VERSION_ARCH.deb: what `make
# install PREFIX=/usr` installs, /etc/rdma-xfer, and Depends on rdma-core's
# libraries and providers and the C runtime only; see scripts/deb.sh.
deb: build-bins
	scripts/deb.sh '$(RELEASE_DIR)'

# target/deb-root: Debian 12 (debootstrap minbase) with the package
# installed by apt-get from inside it; see scripts/deb-root.sh.
deb-root: deb
	scripts/deb-root.sh

# Removes exactly what `make install` with the same PREFIX and DESTDIR put there.
uninstall:
	DESTDIR='$(DESTDIR)' PREFIX='$(PREFIX)' scripts/install.sh --uninstall

clean:
	$(CARGO) clean
