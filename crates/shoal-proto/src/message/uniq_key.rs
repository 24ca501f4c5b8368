//! Client unique key `UNIQ_KEY` (spec §4.6): generation and parsing.
//!
//! Layout (hex, uppercase): client IP (4 or 16 bytes) + pid (short) + a per-process random int
//! (Java uses the class loader's hash code) + milliseconds since the start of the current month
//! (int) + counter (short, low 16 bits of an incrementing counter). IPv4 ⇒ 32 chars,
//! IPv6 ⇒ 56 chars.
//!
//! Deviation: Java measures the month in the JVM's local time zone; Shoal uses UTC (the crate
//! has no time-zone database). Brokers treat the key as an opaque unique string.

use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::msg_id::{parse_hex, push_hex};
use crate::{ProtoError, Result};

/// Length of a UNIQ_KEY generated with an IPv4 client address.
pub const UNIQ_KEY_V4_LEN: usize = 32;
/// Length of a UNIQ_KEY generated with an IPv6 client address.
pub const UNIQ_KEY_V6_LEN: usize = 56;

const DAY_MS: i64 = 86_400_000;

/// Days since 1970-01-01 of the civil date (proleptic Gregorian; H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Civil (year, month) of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m)
}

/// Start (ms since the epoch, UTC) of the month containing `now_ms`, shifted by `delta` months.
pub fn month_start_ms(now_ms: i64, delta: i64) -> i64 {
    let (y, m) = civil_from_days(now_ms.div_euclid(DAY_MS));
    let months = y * 12 + (m - 1) + delta;
    days_from_civil(months.div_euclid(12), months.rem_euclid(12) + 1, 1) * DAY_MS
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Thread-safe generator of UNIQ_KEYs for one client process.
#[derive(Debug)]
pub struct UniqKeyGenerator {
    /// Hex of IP + pid + process hash.
    prefix: String,
    counter: AtomicU32,
    /// The month of the last key: the days (since the epoch) of its first day in the high
    /// half and of the next month's first day in the low half, one word so that a reader
    /// sees both of the same month (0: none yet). Spares the calendar per key.
    month: AtomicU64,
}

impl UniqKeyGenerator {
    /// A generator for a client at `ip`, using this process's id (truncated to a short) and a
    /// random int drawn once for this generator.
    pub fn new(ip: IpAddr) -> Self {
        let random = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        Self::with_parts(ip, std::process::id() as i16, random as i32)
    }

    /// A generator with an explicit pid and process hash (for tests and reproducible ids).
    pub fn with_parts(ip: IpAddr, pid: i16, process_hash: i32) -> Self {
        let mut prefix = String::with_capacity(UNIQ_KEY_V6_LEN);
        match ip {
            IpAddr::V4(ip) => push_hex(&mut prefix, &ip.octets()),
            IpAddr::V6(ip) => push_hex(&mut prefix, &ip.octets()),
        }
        push_hex(&mut prefix, &pid.to_be_bytes());
        push_hex(&mut prefix, &process_hash.to_be_bytes());
        UniqKeyGenerator {
            prefix,
            counter: AtomicU32::new(0),
            month: AtomicU64::new(0),
        }
    }

    /// The next key, timed with the system clock.
    pub fn next_key(&self) -> String {
        self.next_key_at(now_ms())
    }

    /// [`month_start_ms`] of `now_ms`, from the month of the last key when `now_ms` is in it.
    fn month_start(&self, now_ms: i64) -> i64 {
        let cached = self.month.load(Ordering::Relaxed);
        let (start, next) = (
            (cached >> 32) as i64 * DAY_MS,
            (cached as u32) as i64 * DAY_MS,
        );
        if start <= now_ms && now_ms < next {
            return start;
        }
        let start = month_start_ms(now_ms, 0);
        let next = month_start_ms(now_ms, 1);
        // Months of years 1970 to about 11 million fit; others are not cached.
        if let (Ok(s), Ok(n)) = (u32::try_from(start / DAY_MS), u32::try_from(next / DAY_MS)) {
            self.month
                .store((u64::from(s) << 32) | u64::from(n), Ordering::Relaxed);
        }
        start
    }

    /// The next key for the time `now_ms` (ms since the epoch).
    pub fn next_key_at(&self, now_ms: i64) -> String {
        // A month can exceed i32::MAX ms; Java casts to int (wrapping), which is the same bits
        // as this u32. The parser reads it back unsigned.
        let span = (now_ms - self.month_start(now_ms)) as u32;
        let counter = self.counter.fetch_add(1, Ordering::Relaxed) as u16;
        let mut out = String::with_capacity(self.prefix.len() + 12);
        out.push_str(&self.prefix);
        // Span and counter as one six-byte run: one copy of their hex.
        let [s0, s1, s2, s3] = span.to_be_bytes();
        let [c0, c1] = counter.to_be_bytes();
        push_hex(&mut out, &[s0, s1, s2, s3, c0, c1]);
        out
    }
}

/// The parts of a UNIQ_KEY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqKey {
    /// Client IP.
    pub ip: IpAddr,
    /// Client pid (truncated to a short).
    pub pid: i16,
    /// Per-process random int (Java: class loader hash code).
    pub process_hash: i32,
    /// Milliseconds since the start of the month the key was made in (Java writes this as a
    /// wrapping int; read unsigned it covers any month).
    pub month_offset_ms: u32,
    /// Counter (low 16 bits).
    pub counter: u16,
}

impl UniqKey {
    /// Parses a UNIQ_KEY of 32 (IPv4) or 56 (IPv6) hex chars.
    pub fn parse(s: &str) -> Result<Self> {
        let ip_len = match s.len() {
            UNIQ_KEY_V4_LEN => 4,
            UNIQ_KEY_V6_LEN => 16,
            n => {
                return Err(ProtoError::Invalid(format!(
                    "UNIQ_KEY {s:?} has {n} characters, expected 32 or 56"
                )))
            }
        };
        let bytes = parse_hex(s, "UNIQ_KEY")?;
        let bad = || ProtoError::Invalid(format!("UNIQ_KEY {s:?} is malformed"));
        let ip = match ip_len {
            4 => IpAddr::V4(Ipv4Addr::from(
                <[u8; 4]>::try_from(bytes.get(..4).ok_or_else(bad)?).map_err(|_| bad())?,
            )),
            _ => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(bytes.get(..16).ok_or_else(bad)?).map_err(|_| bad())?,
            )),
        };
        let rest = bytes.get(ip_len..).ok_or_else(bad)?;
        match rest {
            [p0, p1, h0, h1, h2, h3, t0, t1, t2, t3, c0, c1] => Ok(UniqKey {
                ip,
                pid: i16::from_be_bytes([*p0, *p1]),
                process_hash: i32::from_be_bytes([*h0, *h1, *h2, *h3]),
                month_offset_ms: u32::from_be_bytes([*t0, *t1, *t2, *t3]),
                counter: u16::from_be_bytes([*c0, *c1]),
            }),
            _ => Err(bad()),
        }
    }

    /// The time the key was made (ms since the epoch), assuming it was made at most about a
    /// month before `now_ms`: this month's start + offset, or last month's if that would lie
    /// in the future (as Java `getNearlyTimeFromID`, in UTC, but reading the offset unsigned so
    /// keys made late in a month parse correctly).
    pub fn nearly_timestamp_ms(&self, now_ms: i64) -> i64 {
        let span = i64::from(self.month_offset_ms);
        let start = month_start_ms(now_ms, 0);
        if start + span >= now_ms {
            month_start_ms(now_ms, -1) + span
        } else {
            start + span
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    #[test]
    fn month_arithmetic() {
        // 2026-11-29T20:56:14Z
        let now = 1_795_985_774_000;
        assert_eq!(month_start_ms(now, 0), 1_793_491_200_000); // 2026-11-01
        assert_eq!(month_start_ms(now, -1), 1_790_812_800_000); // 2026-10-01
        assert_eq!(month_start_ms(now, 1), 1_796_083_200_000); // 2026-12-01
        assert_eq!(month_start_ms(0, 0), 0);
        assert_eq!(month_start_ms(0, -1), -31 * DAY_MS);
        // Leap year February.
        let mar_2024 = days_from_civil(2024, 3, 1) * DAY_MS;
        assert_eq!(
            month_start_ms(mar_2024, -1),
            days_from_civil(2024, 2, 1) * DAY_MS
        );
        assert_eq!(mar_2024 - month_start_ms(mar_2024, -1), 29 * DAY_MS);
    }

    #[test]
    fn spec_example_parses() {
        let k = UniqKey::parse("C0A800020F8A18B4AAC27E0E0E4C0000").unwrap();
        assert_eq!(k.ip, IpAddr::V4(Ipv4Addr::new(192, 168, 0, 2)));
        assert_eq!(k.pid, 0x0F8A);
        assert_eq!(k.process_hash, 0x18B4_AAC2);
        assert_eq!(k.month_offset_ms, 0x7E0E_0E4C);
        assert_eq!(k.counter, 0);
    }

    #[test]
    fn generates_and_parses_back() {
        let ip = IpAddr::V4(Ipv4Addr::new(192, 168, 0, 2));
        let g = UniqKeyGenerator::with_parts(ip, 0x0F8A, 0x18B4_AAC2);
        let now = 1_795_985_774_000;
        let a = g.next_key_at(now);
        let b = g.next_key_at(now);
        assert_eq!(a.len(), 32);
        assert_eq!(&a[..20], "C0A800020F8A18B4AAC2");
        assert_ne!(a, b);
        let pa = UniqKey::parse(&a).unwrap();
        let pb = UniqKey::parse(&b).unwrap();
        assert_eq!((pa.counter, pb.counter), (0, 1));
        assert_eq!(pa.ip, ip);
        assert_eq!(pa.nearly_timestamp_ms(now + 5_000), now);
        // Parsed in the next month: resolves to the previous month.
        let next_month = month_start_ms(now, 1) + 1_000;
        assert_eq!(pa.nearly_timestamp_ms(next_month), now);

        let g6 = UniqKeyGenerator::new("fe80::1".parse().unwrap());
        let k6 = g6.next_key();
        assert_eq!(k6.len(), 56);
        assert_eq!(
            UniqKey::parse(&k6).unwrap().ip,
            "fe80::1".parse::<IpAddr>().unwrap()
        );
    }

    proptest::proptest! {
        /// The month kept from the last key never changes a key's time: any order of times
        /// (across month ends, backwards, before 1970) gives the calendar's offset.
        #[test]
        fn the_kept_month_gives_the_calendars_offset(
            times in proptest::collection::vec(
                proptest::prop_oneof![
                    // Around the end of November 2026 and of February 2024.
                    1_796_083_200_000i64 - 5_000..1_796_083_200_000 + 5_000,
                    1_709_251_200_000i64 - 5_000..1_709_251_200_000 + 5_000,
                    -100 * DAY_MS..4_000_000_000_000,
                ],
                1..40,
            )
        ) {
            let g = UniqKeyGenerator::with_parts(IpAddr::V4(Ipv4Addr::LOCALHOST), 1, 2);
            for now in times {
                let key = UniqKey::parse(&g.next_key_at(now)).unwrap();
                proptest::prop_assert_eq!(
                    key.month_offset_ms,
                    (now - month_start_ms(now, 0)) as u32,
                    "at {}", now
                );
            }
        }
    }

    #[test]
    fn thread_safe_and_unique() {
        let g = Arc::new(UniqKeyGenerator::new(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let now = 1_795_985_774_000;
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let g = Arc::clone(&g);
                std::thread::spawn(move || {
                    (0..5000).map(|_| g.next_key_at(now)).collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all = HashSet::new();
        for h in handles {
            for k in h.join().unwrap() {
                assert!(all.insert(k));
            }
        }
        assert_eq!(all.len(), 20_000);
    }

    #[test]
    fn bad_keys_are_errors() {
        for s in [
            "",
            "C0A8",
            "C0A800020F8A18B4AAC27E0E0E4C000Z",
            &"0".repeat(33),
            &"é".repeat(16),
        ] {
            assert!(UniqKey::parse(s).is_err(), "{s:?}");
        }
    }
}
