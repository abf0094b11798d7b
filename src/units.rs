//! Human-friendly sizes and rates. All multipliers are binary (K = 1024).
#![forbid(unsafe_code)]

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SizeError {
    #[error("size is empty")]
    Empty,
    #[error("size may not be negative: {0:?}")]
    Negative(String),
    #[error("size must be a whole number (no fractions): {0:?}")]
    Fractional(String),
    #[error("size is not a number: {0:?}")]
    NotANumber(String),
    #[error("unknown size suffix {0:?} (use K, M, G, T, P; e.g. 4K, 1MiB)")]
    BadSuffix(String),
    #[error("size {0:?} does not fit in 64 bits")]
    Overflow(String),
}

/// Parses "123", "4K", "4k", "1MiB", "2 GB", ... (binary multiples, case-insensitive).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    if t.starts_with('-') {
        return Err(SizeError::Negative(s.into()));
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, rest) = t.split_at(split);
    if rest.starts_with(['.', ',']) {
        return Err(SizeError::Fractional(s.into()));
    }
    if digits.is_empty() {
        return Err(SizeError::NotANumber(s.into()));
    }
    let n: u64 = digits.parse().map_err(|_| SizeError::Overflow(s.into()))?;
    let shift = match rest.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ => return Err(SizeError::BadSuffix(rest.trim_start().into())),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::Overflow(s.into()))
}

/// Parses a duration: a whole number with a unit `s`, `m`, `h` or `d`
/// (seconds without one), e.g. `90s`, `30m`, `24h`, `7d`; at least a
/// second, at most ten years.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => {
            return Err(format!(
                "{s:?}: expected a number with s, m, h or d (e.g. 24h)"
            ));
        }
    };
    let secs = num
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(per))
        .filter(|n| (1..=10 * 365 * 86400).contains(n))
        .ok_or_else(|| format!("{s:?}: expected between 1s and 3650d (e.g. 24h)"))?;
    Ok(std::time::Duration::from_secs(secs))
}

/// "512 B", "1.5 MiB", "16.0 EiB".
pub fn format_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    // Move up while the one-decimal rendering would read 1024.0 or more.
    while value >= 1023.95 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let name = UNITS.get(unit).copied().unwrap_or("EiB");
    format!("{value:.1} {name}")
}

/// Throughput in MiB/s; 0.0 for a zero, negative or non-finite duration (never inf/NaN).
pub fn mib_per_sec(bytes: u64, secs: f64) -> f64 {
    if !(secs.is_finite() && secs > 0.0) {
        return 0.0;
    }
    let rate = bytes as f64 / (1024.0 * 1024.0) / secs;
    if rate.is_finite() { rate } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("123", 123),
            ("123B", 123),
            ("4K", 4096),
            ("4k", 4096),
            ("4KB", 4096),
            ("4kib", 4096),
            ("4 KiB", 4096),
            ("1M", 1 << 20),
            ("1MiB", 1 << 20),
            ("1mb", 1 << 20),
            ("2G", 2 << 30),
            ("2GiB", 2 << 30),
            ("1T", 1 << 40),
            ("1TiB", 1 << 40),
            ("3P", 3 << 50),
            (" 8M ", 8 << 20),
            ("18446744073709551615", u64::MAX),
            ("15P", 15 << 50),
            ("16777215T", 16_777_215 << 40),
        ];
        for (s, v) in cases {
            assert_eq!(parse_size(s), Ok(*v), "{s:?}");
        }
    }

    #[test]
    fn rejects_bad_sizes() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("   "), Err(SizeError::Empty));
        assert!(matches!(parse_size("-1"), Err(SizeError::Negative(_))));
        assert!(matches!(parse_size("-1K"), Err(SizeError::Negative(_))));
        assert!(matches!(parse_size("1.5M"), Err(SizeError::Fractional(_))));
        assert!(matches!(parse_size("1,5M"), Err(SizeError::Fractional(_))));
        assert!(matches!(parse_size("0.5"), Err(SizeError::Fractional(_))));
        assert!(matches!(parse_size(".5"), Err(SizeError::Fractional(_))));
        for junk in ["K", "abc", "+5", "MiB"] {
            assert!(
                matches!(parse_size(junk), Err(SizeError::NotANumber(_))),
                "{junk:?}"
            );
        }
        for bad in ["4X", "4KK", "4Kb2", "4 K B", "1E", "12abc", "4k!", "0x10"] {
            assert!(
                matches!(parse_size(bad), Err(SizeError::BadSuffix(_))),
                "{bad:?}"
            );
        }
        for big in [
            "18446744073709551616",
            "99999999999999999999999",
            "16777216T",
            "16384P",
            "18446744073709551615K",
        ] {
            assert!(
                matches!(parse_size(big), Err(SizeError::Overflow(_))),
                "{big:?}"
            );
        }
    }

    #[test]
    fn formats_bytes() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1.0 KiB");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(1_572_864), "1.5 MiB");
        assert_eq!(format_bytes((1 << 20) - 1), "1.0 MiB");
        assert_eq!(format_bytes(5 << 30), "5.0 GiB");
        assert_eq!(format_bytes(1 << 40), "1.0 TiB");
        assert_eq!(format_bytes(1 << 60), "1.0 EiB");
        assert_eq!(format_bytes(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn rates_are_finite() {
        assert_eq!(mib_per_sec(1 << 20, 1.0), 1.0);
        assert_eq!(mib_per_sec(10 << 20, 2.0), 5.0);
        assert_eq!(mib_per_sec(0, 1.0), 0.0);
        for secs in [0.0, -0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(mib_per_sec(1 << 20, secs), 0.0, "{secs}");
        }
        assert!(mib_per_sec(u64::MAX, f64::MIN_POSITIVE).is_finite());
        assert!(mib_per_sec(u64::MAX, 1e-300).is_finite());
    }

    #[test]
    fn durations() {
        let d = |s| parse_duration(s).map(|d| d.as_secs());
        assert_eq!(d("90"), Ok(90));
        assert_eq!(d("90s"), Ok(90));
        assert_eq!(d("30m"), Ok(1800));
        assert_eq!(d("24h"), Ok(86400));
        assert_eq!(d("7d"), Ok(7 * 86400));
        for bad in [
            "",
            "0",
            "0s",
            "h",
            "1w",
            "-1h",
            "1.5h",
            "99999999999d",
            "1 h",
        ] {
            assert!(d(bad).is_err(), "{bad}");
        }
    }
}
