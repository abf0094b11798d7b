//! Fitting the registered buffers to RLIMIT_MEMLOCK before connecting or
//! listening: the receiver's ring (slots x slot size, per session) and the
//! sender's staging buffers (depth x chunk size). Stock hosts allow 8 MiB
//! (Debian 12, fresh VMs, ssh sessions), less than the defaults need.
//! Settings the user gave are kept (and refused with the limit's numbers
//! if they do not fit); defaults are lowered: fewer buffers first, then
//! smaller ones. The two sides fit on their own: a write is as long as the
//! smaller of the sender's chunk and the receiver's slot (the protocol's
//! rule), so any pair works.

use crate::error::XferError;
use crate::proto::MAX_MESSAGE;
use crate::sys::os::MemlockRoom;
use crate::units::format_bytes;

/// Fewest buffers a fit chooses: one filled while the other is written.
pub const MIN_FITTED_COUNT: u32 = 2;
/// Smallest buffer a fit chooses: below it, per-write costs dominate.
pub const MIN_FITTED_CHUNK: u32 = 64 << 10;

/// Pinned for the provider's queues and doorbells: nothing on SoftRoCE
/// (kernel memory there), the CQ and QP rings and doorbell records on
/// mlx5 (user memory pinned like an MR, a few pages to tens of KiB at
/// these depths).
pub const PROVIDER_HEADROOM: u64 = 256 << 10;

/// A pool of equal buffers: the ring's slots or the staging buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffers {
    pub count: u32,
    pub chunk_size: u32,
}

/// Which buffer settings the user gave: those are kept as given; the
/// others are defaults, lowered when the memlock limit is lower.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Given {
    /// `--slots` (receiver) or `--depth` (sender).
    pub count: bool,
    /// `--chunk-size`.
    pub chunk_size: bool,
}

/// Registered memory a side needs besides its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overhead {
    /// Whatever the buffers: control messages, the provider's queues.
    pub fixed: u64,
    /// For each buffer (the receiver posts a receive for each slot).
    pub per_buffer: u64,
}

impl Overhead {
    /// `sends` + `receives` control buffers of `MAX_MESSAGE` bytes, each
    /// slot's own receive (`per_buffer_receives`: 1 or 0), and the
    /// provider's headroom.
    pub fn control(messages: u64, per_buffer_receives: u64) -> Self {
        let page = MAX_MESSAGE as u64;
        Overhead {
            fixed: messages
                .saturating_mul(page)
                .saturating_add(PROVIDER_HEADROOM),
            per_buffer: per_buffer_receives.saturating_mul(page),
        }
    }

    /// Bytes pinned with `buffers` (registrations take whole pages). Each
    /// buffer has room for its chunk's tag after the chunk (with a token;
    /// counted always).
    pub fn total(&self, buffers: Buffers) -> u64 {
        let buffer = u64::from(buffers.chunk_size) + crate::proto::CHUNK_TAG_LEN as u64;
        let pool = u64::from(buffers.count) * buffer;
        pool.div_ceil(4096)
            .saturating_mul(4096)
            .saturating_add(self.fixed)
            .saturating_add(u64::from(buffers.count).saturating_mul(self.per_buffer))
    }
}

/// The largest buffers that fit in `room` bytes (None: no limit), with
/// `overhead`: `asked` if it fits; otherwise, keeping what was `given`,
/// the most buffers (down to `MIN_FITTED_COUNT`) of the asked size, else
/// of half that size, and so on down to `MIN_FITTED_CHUNK`. Err: nothing
/// fits, with the smallest configuration tried.
pub fn fit_buffers(
    asked: Buffers,
    given: Given,
    overhead: Overhead,
    room: Option<u64>,
) -> Result<Buffers, Buffers> {
    let fits = |b: Buffers| room.is_none_or(|room| overhead.total(b) <= room);
    if fits(asked) {
        return Ok(asked);
    }
    let fewest = if given.count {
        asked.count
    } else {
        MIN_FITTED_COUNT.min(asked.count)
    };
    let mut chunk_size = asked.chunk_size;
    loop {
        // The most buffers of this size that fit, if at least `fewest`.
        let found = (fewest..=asked.count)
            .rev()
            .map(|count| Buffers { count, chunk_size })
            .find(|&b| fits(b));
        if let Some(b) = found {
            return Ok(b);
        }
        let half = chunk_size / 2;
        if given.chunk_size || half < MIN_FITTED_CHUNK {
            return Err(Buffers {
                count: fewest,
                chunk_size,
            });
        }
        chunk_size = half;
    }
}

/// Which pool of buffers, for the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pool {
    /// The receiver's ring: `--slots`.
    Ring,
    /// The ring of a receiver that may pass files on in a relay chain:
    /// its defaults take half the room, the staging of its session to
    /// the next host the other half.
    RelayRing,
    /// The sender's staging buffers: `--depth`.
    Staging,
    /// The staging buffers of each of a sender's N lanes: an Nth of the
    /// room each.
    LaneStaging(u32),
}

impl Pool {
    fn count_option(self) -> &'static str {
        match self {
            Pool::Ring | Pool::RelayRing => "--slots",
            Pool::Staging | Pool::LaneStaging(_) => "--depth",
        }
    }

    /// "a ring of 7 slots of 1.0 MiB per session (--slots 7 --chunk-size 1M)".
    fn describe(self, b: Buffers) -> String {
        let (count, size) = (b.count, format_bytes(u64::from(b.chunk_size)));
        let options = format!(
            "{} {count} --chunk-size {}",
            self.count_option(),
            size_option(b.chunk_size)
        );
        match self {
            Pool::Ring => format!("a ring of {count} slots of {size} per session ({options})"),
            Pool::RelayRing => format!(
                "a ring of {count} slots of {size} per session ({options}; half the room, the \
                 other half for passing files on in a relay chain)"
            ),
            Pool::Staging => format!("{count} staging buffers of {size} ({options})"),
            Pool::LaneStaging(n) => {
                format!("{count} staging buffers of {size} per lane, {n} lanes ({options})")
            }
        }
    }
}

/// `buffers`, or the largest that fit this process's memlock limit (see
/// `fit_buffers`); a warning says once what was lowered, the limit and
/// how to raise it. Settings given that do not fit, or a limit too low
/// for the smallest buffers, are a memlock error.
pub(crate) fn fit_to_memlock(
    role: Pool,
    asked: Buffers,
    given: Given,
    overhead: Overhead,
) -> Result<Buffers, XferError> {
    let room = crate::sys::os::memlock_room();
    let share = room_for(role, given, room.available());
    // Said as a relay ring's only where it took half.
    let role = match role {
        Pool::RelayRing if share == room.available() => Pool::Ring,
        role => role,
    };
    match fit_buffers(asked, given, overhead, share) {
        Ok(fitted) if fitted == asked => Ok(asked),
        Ok(fitted) => {
            tracing::warn!(
                "{}: using {} instead of {} x {}; for full speed raise the limit: `ulimit -l \
                 unlimited` (as root), a memlock line in /etc/security/limits.conf, or \
                 LimitMEMLOCK=infinity in a systemd unit",
                limit_found(&room),
                role.describe(fitted),
                asked.count,
                format_bytes(u64::from(asked.chunk_size)),
            );
            Ok(fitted)
        }
        Err(smallest) => {
            let what = refused(role, smallest, given);
            Err(XferError::Sys(
                room.refusal(overhead.total(smallest), Some(what)),
            ))
        }
    }
}

/// The room `role`'s buffers may take of `available` (None: no limit):
/// a relay ring's defaults half of it.
fn room_for(role: Pool, given: Given, available: Option<u64>) -> Option<u64> {
    match role {
        Pool::RelayRing if given == Given::default() => available.map(|a| a / 2),
        Pool::LaneStaging(n) => available.map(|a| a / u64::from(n.max(1))),
        _ => available,
    }
}

/// What a memlock refusal was for: the settings given, or the smallest
/// the fit tried with them.
fn refused(role: Pool, smallest: Buffers, given: Given) -> String {
    let tried = match (given.count, given.chunk_size) {
        (true, true) => {
            return format!(
                "{} as given, with their control buffers",
                role.describe(smallest)
            );
        }
        (true, false) => format!("the smallest buffers for that {}", role.count_option()),
        (false, true) => "the fewest buffers of that --chunk-size".to_string(),
        (false, false) => "the smallest the tools choose".to_string(),
    };
    format!(
        "even {}, {tried}, with their control buffers",
        role.describe(smallest)
    )
}

/// "RLIMIT_MEMLOCK is 8.0 MiB (hard limit 8.0 MiB, 0 B pinned already)".
fn limit_found(room: &MemlockRoom) -> String {
    match *room {
        MemlockRoom::Unlimited => "no memlock limit".into(),
        MemlockRoom::Limited {
            limit,
            hard,
            pinned,
        } => {
            let hard = match hard {
                u64::MAX => "unlimited".to_string(),
                h => format_bytes(h),
            };
            format!(
                "RLIMIT_MEMLOCK is {} (hard limit {hard}, {} pinned already)",
                format_bytes(limit),
                format_bytes(pinned)
            )
        }
    }
}

/// A size as an option value: "1M", "64K", "5000".
fn size_option(bytes: u32) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const KIB: u32 = 1 << 10;
    const DEFAULTS: Buffers = Buffers {
        count: 16,
        chunk_size: 1 << 20,
    };
    /// The sender's overhead (72 control buffers); the receiver's is
    /// `Overhead::control(32, 1)`.
    fn sender() -> Overhead {
        Overhead::control(72, 0)
    }
    fn receiver() -> Overhead {
        Overhead::control(32, 1)
    }
    fn b(count: u32, chunk_size: u32) -> Buffers {
        Buffers { count, chunk_size }
    }
    const NOTHING_GIVEN: Given = Given {
        count: false,
        chunk_size: false,
    };

    #[test]
    fn the_overhead_counts_pages_control_buffers_and_headroom() {
        // 16 buffers of 1 MiB, each with room for its tag: one page more.
        assert_eq!(
            sender().total(DEFAULTS),
            16 * MIB + 4096 + 72 * 4096 + PROVIDER_HEADROOM
        );
        assert_eq!(
            receiver().total(DEFAULTS),
            16 * MIB + 4096 + (32 + 16) * 4096 + PROVIDER_HEADROOM
        );
        // A pool of 3 x (5000 + 32) bytes pins 4 pages.
        let bare = Overhead {
            fixed: 0,
            per_buffer: 0,
        };
        assert_eq!(bare.total(b(3, 5000)), 4 * 4096);
        assert_eq!(bare.total(b(1024, 64 << 20)), (64 << 30) + (32 << 10));
    }

    #[test]
    fn unlimited_or_roomy_keeps_what_was_asked() {
        for given in [
            NOTHING_GIVEN,
            Given {
                count: true,
                chunk_size: true,
            },
        ] {
            assert_eq!(fit_buffers(DEFAULTS, given, sender(), None), Ok(DEFAULTS));
            assert_eq!(
                fit_buffers(b(1024, 64 << 20), given, sender(), None),
                Ok(b(1024, 64 << 20))
            );
            assert_eq!(
                fit_buffers(DEFAULTS, given, receiver(), Some(64 * MIB)),
                Ok(DEFAULTS)
            );
        }
        // Exactly enough is enough.
        let exact = receiver().total(DEFAULTS);
        assert_eq!(
            fit_buffers(DEFAULTS, NOTHING_GIVEN, receiver(), Some(exact)),
            Ok(DEFAULTS)
        );
        assert_ne!(
            fit_buffers(DEFAULTS, NOTHING_GIVEN, receiver(), Some(exact - 1)),
            Ok(DEFAULTS)
        );
    }

    #[test]
    fn eight_mib_takes_fewer_buffers_of_the_default_size() {
        // A stock host: 7 buffers of 1 MiB on both sides.
        assert_eq!(
            fit_buffers(DEFAULTS, NOTHING_GIVEN, sender(), Some(8 * MIB)),
            Ok(b(7, 1 << 20))
        );
        assert_eq!(
            fit_buffers(DEFAULTS, NOTHING_GIVEN, receiver(), Some(8 * MIB)),
            Ok(b(7, 1 << 20))
        );
        // What is pinned already counts (the room is what is left).
        assert_eq!(
            fit_buffers(DEFAULTS, NOTHING_GIVEN, sender(), Some(8 * MIB - 3 * MIB)),
            Ok(b(4, 1 << 20))
        );
        // Whatever the room, the result fits it and never grows.
        for room in (0..40u64).map(|i| i * MIB / 2) {
            for over in [sender(), receiver()] {
                if let Ok(fit) = fit_buffers(DEFAULTS, NOTHING_GIVEN, over, Some(room)) {
                    assert!(over.total(fit) <= room, "{fit:?} in {room}");
                    assert!(fit.count <= 16 && fit.chunk_size <= 1 << 20, "{fit:?}");
                    assert!(fit.count >= MIN_FITTED_COUNT, "{fit:?}");
                    assert!(fit.chunk_size >= MIN_FITTED_CHUNK, "{fit:?}");
                }
            }
        }
    }

    #[test]
    fn below_two_buffers_the_buffers_get_smaller() {
        // 2 x 1 MiB does not fit 2 MiB with the overhead: 512 KiB buffers,
        // as many as fit.
        let room = 2 * MIB;
        let fit = fit_buffers(DEFAULTS, NOTHING_GIVEN, sender(), Some(room)).unwrap();
        assert_eq!(fit, b(2, 512 * KIB));
        let fit = fit_buffers(DEFAULTS, NOTHING_GIVEN, sender(), Some(MIB)).unwrap();
        assert_eq!(fit, b(3, 128 * KIB));
        // Down to 2 x 64 KiB, never below.
        let smallest = b(2, MIN_FITTED_CHUNK);
        let room = sender().total(smallest);
        assert_eq!(
            fit_buffers(DEFAULTS, NOTHING_GIVEN, sender(), Some(room)),
            Ok(smallest)
        );
        assert_eq!(
            fit_buffers(DEFAULTS, NOTHING_GIVEN, sender(), Some(room - 1)),
            Err(smallest)
        );
    }

    #[test]
    fn sixty_four_kib_fits_nothing() {
        for over in [sender(), receiver()] {
            assert_eq!(
                fit_buffers(DEFAULTS, NOTHING_GIVEN, over, Some(64 * 1024)),
                Err(b(2, MIN_FITTED_CHUNK))
            );
        }
        assert_eq!(
            fit_buffers(DEFAULTS, NOTHING_GIVEN, sender(), Some(0)),
            Err(b(2, MIN_FITTED_CHUNK))
        );
    }

    #[test]
    fn given_settings_are_kept_or_refused() {
        let room = Some(8 * MIB);
        // Both given: as given, or nothing.
        let both = Given {
            count: true,
            chunk_size: true,
        };
        assert_eq!(fit_buffers(DEFAULTS, both, receiver(), room), Err(DEFAULTS));
        assert_eq!(
            fit_buffers(b(4, 1 << 20), both, receiver(), room),
            Ok(b(4, 1 << 20))
        );
        // --slots 16 given: the slots get smaller (16 x 256 KiB is 4 MiB).
        let count = Given {
            count: true,
            chunk_size: false,
        };
        assert_eq!(
            fit_buffers(DEFAULTS, count, receiver(), room),
            Ok(b(16, 256 * KIB))
        );
        assert_eq!(
            fit_buffers(b(1024, 1 << 20), count, receiver(), room),
            Err(b(1024, MIN_FITTED_CHUNK))
        );
        // --chunk-size 4M given: fewer of them, at least 2.
        let chunk = Given {
            count: false,
            chunk_size: true,
        };
        assert_eq!(
            fit_buffers(b(16, 4 << 20), chunk, sender(), Some(16 * MIB)),
            Ok(b(3, 4 << 20))
        );
        assert_eq!(
            fit_buffers(b(16, 4 << 20), chunk, sender(), room),
            Err(b(2, 4 << 20))
        );
        // A small given chunk: only the count is lowered.
        assert_eq!(
            fit_buffers(
                b(16, 16 * KIB),
                chunk,
                sender(),
                Some(sender().total(b(12, 16 * KIB)))
            ),
            Ok(b(12, 16 * KIB))
        );
    }

    #[test]
    fn a_count_below_the_minimum_is_not_raised() {
        // A configuration asking for one buffer keeps one.
        assert_eq!(
            fit_buffers(b(1, 1 << 20), NOTHING_GIVEN, sender(), Some(MIB)),
            Ok(b(1, 256 * KIB))
        );
    }

    #[test]
    fn a_refusal_says_what_was_tried() {
        let both = Given {
            count: true,
            chunk_size: true,
        };
        assert_eq!(
            refused(Pool::Ring, DEFAULTS, both),
            "a ring of 16 slots of 1.0 MiB per session (--slots 16 --chunk-size 1M) as given, \
             with their control buffers"
        );
        let chunk = Given {
            count: false,
            chunk_size: true,
        };
        assert_eq!(
            refused(Pool::Staging, b(2, 4 << 20), chunk),
            "even 2 staging buffers of 4.0 MiB (--depth 2 --chunk-size 4M), the fewest buffers \
             of that --chunk-size, with their control buffers"
        );
        let count = Given {
            count: true,
            chunk_size: false,
        };
        assert!(refused(Pool::Staging, b(9, 64 << 10), count).contains("for that --depth"));
        assert!(refused(Pool::Ring, b(2, 64 << 10), NOTHING_GIVEN).contains("the tools choose"));
    }

    #[test]
    fn sizes_read_as_options_and_settings_as_words() {
        assert_eq!(size_option(1 << 20), "1M");
        assert_eq!(size_option(64 << 10), "64K");
        assert_eq!(size_option(3 << 19), "1536K");
        assert_eq!(size_option(5000), "5000");
        assert_eq!(
            Pool::Ring.describe(b(7, 1 << 20)),
            "a ring of 7 slots of 1.0 MiB per session (--slots 7 --chunk-size 1M)"
        );
        assert_eq!(
            Pool::Staging.describe(b(7, 512 << 10)),
            "7 staging buffers of 512.0 KiB (--depth 7 --chunk-size 512K)"
        );
    }

    #[test]
    fn a_relay_ring_leaves_half_the_room_to_the_staging_of_its_next_hop() {
        let room = Some(8 * MIB);
        let receiver = Overhead::control(32, 1);
        let half = room_for(Pool::RelayRing, Given::default(), room);
        assert_eq!(half, Some(4 * MIB));
        let ring = fit_buffers(DEFAULTS, Given::default(), receiver, half).unwrap();
        let pinned = receiver.total(ring);
        assert!(pinned <= 4 * MIB, "{ring:?}");
        // What is left takes the staging of the session to the next host.
        let staging = fit_buffers(DEFAULTS, Given::default(), sender(), Some(8 * MIB - pinned));
        assert!(
            staging.is_ok_and(|b| b.count >= MIN_FITTED_COUNT),
            "{staging:?}"
        );
        // A ring of its own (no relay) takes the whole room; settings the
        // user gave keep it too; no limit stays no limit.
        assert_eq!(room_for(Pool::Ring, Given::default(), room), room);
        let given = Given {
            count: true,
            chunk_size: false,
        };
        assert_eq!(room_for(Pool::RelayRing, given, room), room);
        assert_eq!(room_for(Pool::RelayRing, Given::default(), None), None);
    }
}
