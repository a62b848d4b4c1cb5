//! Time: the `Millis` instant every other module speaks, its wire form, and the clock seam.
//!
//! Inside the limiter an instant is whole milliseconds since the Unix epoch (`Millis`). Only the
//! wire sees strings: [`format_instant`] writes JavaScript's `toISOString` form and
//! [`parse_instant`] reads RFC 3339 strictly. The engine never reads a clock; the [`Clock`] here
//! is read at the edge (the limiter) and handed inward as `now`.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// An instant or a duration in whole milliseconds (instants count from the Unix epoch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);

impl Millis {
    pub const ZERO: Millis = Millis(0);

    /// `self + d`, saturating at the largest instant.
    #[must_use]
    pub fn plus(self, d: u64) -> Millis {
        Millis(self.0.saturating_add(d))
    }

    /// `self - d`, saturating at the epoch.
    #[must_use]
    pub fn minus(self, d: u64) -> Millis {
        Millis(self.0.saturating_sub(d))
    }

    /// Milliseconds from `earlier` to `self`, zero when `earlier` is later.
    #[must_use]
    pub fn since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_instant(*self))
    }
}

/// The latest instant the wire can carry, the last millisecond `jiff` can represent:
/// 9999-12-30T22:00:00.999Z. Later instants are written as this one.
pub const MAX_INSTANT: Millis = Millis(253_402_207_200_999);

/// Formats an instant exactly as JavaScript's `Date.prototype.toISOString()` does:
/// `2026-11-30T03:11:09.123Z`.
#[must_use]
pub fn format_instant(at: Millis) -> String {
    let ms = at.0.min(MAX_INSTANT.0) as i64;
    // Not `from_millisecond`: it refuses the last 999 ms of `jiff`'s range.
    let ts = jiff::Timestamp::new(ms / 1000, (ms % 1000) as i32 * 1_000_000).expect("instants up to MAX_INSTANT");
    format!("{ts:.3}")
}

/// Why a string is not an instant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InstantError(&'static str);

/// Parses an RFC 3339 instant: `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`.
///
/// The fraction may have any number of digits; it is cut to whole milliseconds (floor). An
/// instant before the Unix epoch reads as the epoch (it is past either way); leap seconds and
/// anything that is not RFC 3339 are refused.
pub fn parse_instant(s: &str) -> Result<Millis, InstantError> {
    const FORM: InstantError = InstantError("must be an RFC 3339 instant like 2026-11-30T03:11:09.123Z");
    let b = s.as_bytes();
    if b.len() < 20 || b.len() > 64 {
        return Err(FORM);
    }
    let num =
        |from: usize, len: usize| -> Result<i32, InstantError> {
            let digits = b.get(from..from + len).ok_or(FORM)?;
            digits.iter().try_fold(0i32, |acc, &c| {
                if c.is_ascii_digit() { Ok(acc * 10 + i32::from(c - b'0')) } else { Err(FORM) }
            })
        };
    let sep = |at: usize, allowed: &[u8]| -> Result<(), InstantError> {
        if allowed.contains(&b[at]) { Ok(()) } else { Err(FORM) }
    };
    let year = num(0, 4)?;
    sep(4, b"-")?;
    let month = num(5, 2)?;
    sep(7, b"-")?;
    let day = num(8, 2)?;
    sep(10, b"Tt")?;
    let hour = num(11, 2)?;
    sep(13, b":")?;
    let minute = num(14, 2)?;
    sep(16, b":")?;
    let second = num(17, 2)?;
    let mut at = 19;
    let mut millis = 0i64;
    if b[at] == b'.' {
        at += 1;
        let start = at;
        while at < b.len() && b[at].is_ascii_digit() {
            if at - start < 3 {
                millis = millis * 10 + i64::from(b[at] - b'0');
            }
            at += 1;
        }
        let digits = at - start;
        if digits == 0 {
            return Err(FORM);
        }
        for _ in digits..3 {
            millis *= 10;
        }
    }
    let offset_secs: i32 = match b.get(at) {
        Some(b'Z' | b'z') if at + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) if at + 6 == b.len() => {
            sep(at + 3, b":")?;
            let (oh, om) = (num(at + 1, 2)?, num(at + 4, 2)?);
            if oh > 23 || om > 59 {
                return Err(InstantError("has an offset out of range"));
            }
            let secs = oh * 3600 + om * 60;
            if sign == b'-' { -secs } else { secs }
        }
        _ => return Err(FORM),
    };
    if hour > 23 || minute > 59 || second > 59 {
        return Err(InstantError("has a time of day out of range"));
    }
    let date = jiff::civil::Date::new(year as i16, month as i8, day as i8)
        .map_err(|_| InstantError("has a date that does not exist"))?;
    let time = jiff::civil::Time::new(hour as i8, minute as i8, second as i8, 0)
        .map_err(|_| InstantError("has a time of day out of range"))?;
    let offset = jiff::tz::Offset::from_seconds(offset_secs).map_err(|_| FORM)?;
    let ts = offset.to_timestamp(date.to_datetime(time)).map_err(|_| InstantError("is out of range"))?;
    let ms = ts.as_millisecond() + millis;
    // Before the epoch is long past: read as the epoch, the earliest instant there is here (a
    // throttle until then changes nothing, as any past `until`).
    Ok(Millis(ms.max(0) as u64))
}

/// Where the limiter reads `now`. Implementations never run backwards.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Millis;
}

/// Wall-clock milliseconds since the epoch (0 if the system clock is before it).
#[must_use]
pub fn wall_clock_now() -> Millis {
    Millis(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64))
}

/// The production clock: `now = max(wall clock, floor + monotonic time since start)`, where
/// `floor` is the latest `now` the file has recorded. A wall clock stepped backwards therefore
/// never moves the limiter's time backwards, within a run or across restarts.
pub struct SystemClock {
    floor: Millis,
    started: Instant,
    last: AtomicU64,
}

impl SystemClock {
    #[must_use]
    pub fn new(floor: Millis) -> Self {
        SystemClock { floor, started: Instant::now(), last: AtomicU64::new(floor.0) }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        let mono = self.floor.plus(self.started.elapsed().as_millis() as u64);
        let candidate = wall_clock_now().max(mono).0;
        // The wall clock may step back between two reads; never report less than before.
        Millis(self.last.fetch_max(candidate, Ordering::Relaxed).max(candidate))
    }
}

/// A clock that tests move by hand.
#[derive(Default)]
pub struct FakeClock {
    now: Mutex<Millis>,
}

impl FakeClock {
    #[must_use]
    pub fn new(now: Millis) -> Self {
        FakeClock { now: Mutex::new(now) }
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        let mut now = self.now.lock().expect("fake clock lock");
        *now = now.plus(ms);
    }

    /// Sets the clock; setting it backwards is allowed, to test the floor.
    pub fn set(&self, at: Millis) {
        *self.now.lock().expect("fake clock lock") = at;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Millis {
        *self.now.lock().expect("fake clock lock")
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Millis {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_to_iso_string() {
        assert_eq!(format_instant(Millis(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_instant(Millis(1_795_921_869_123)), "2026-11-29T03:11:09.123Z");
        assert_eq!(format_instant(Millis(1_795_921_869_000)), "2026-11-29T03:11:09.000Z");
    }

    #[test]
    fn the_end_of_time_formats_and_round_trips() {
        // Found by the `instants` fuzz target: instants after 9999-12-30T22:00:00.000Z panicked.
        assert_eq!(format_instant(MAX_INSTANT), "9999-12-30T22:00:00.999Z");
        assert_eq!(format_instant(Millis(u64::MAX)), "9999-12-30T22:00:00.999Z");
        assert_eq!(parse_instant("9999-12-30T22:00:00.999Z"), Ok(MAX_INSTANT));
        assert_eq!(parse_instant("9999-12-31T00:00:00.999+02:00"), Ok(MAX_INSTANT));
        assert!(parse_instant("9999-12-30T22:00:01Z").is_err());
        assert!(parse_instant("9999-12-31T23:59:59.999Z").is_err());
    }

    #[test]
    fn parses_rfc3339_forms() {
        let z = parse_instant("2026-11-30T03:11:09.123Z").unwrap();
        assert_eq!(format_instant(z), "2026-11-30T03:11:09.123Z");
        assert_eq!(parse_instant("2026-11-30T03:11:09Z").unwrap(), z.minus(123));
        assert_eq!(parse_instant("2026-11-30T04:11:09.123+01:00").unwrap(), z);
        assert_eq!(parse_instant("2026-11-30T02:41:09.123-00:30").unwrap(), z);
        assert_eq!(parse_instant("2026-11-30T03:11:09.1239999Z").unwrap(), z);
        assert_eq!(parse_instant("2026-11-30T03:11:09.1Z").unwrap(), z.minus(23));
    }

    #[test]
    fn refuses_what_is_not_rfc3339() {
        for bad in [
            "",
            "2026-11-30",
            "2026-11-30T03:11:09",
            "2026-11-30 03:11:09Z",
            "2026-11-30T03:11:09.Z",
            "2026-11-30T03:11Z",
            "2026-02-30T03:11:09Z",
            "2026-11-30T24:00:00Z",
            "2026-11-30T23:59:60Z",
            "2026-11-30T03:11:09+0100",
            "2026-11-30T03:11:09+01",
            "+2026-11-30T03:11:09Z",
            "2026-11-30T03:11:09.123Zjunk",
            "２026-11-30T03:11:09Z",
        ] {
            assert!(parse_instant(bad).is_err(), "{bad:?} should be refused");
        }
        for past in ["1969-12-31T23:59:59.999Z", "0001-01-01T00:00:00Z", "1970-01-01T00:30:00+01:00"] {
            assert_eq!(parse_instant(past), Ok(Millis::ZERO), "{past:?} is before the epoch: read as it");
        }
    }

    #[test]
    fn system_clock_never_goes_below_its_floor() {
        let far = wall_clock_now().plus(3_600_000);
        let clock = SystemClock::new(far);
        assert!(clock.now() >= far);
        let a = clock.now();
        assert!(clock.now() >= a);
    }
}
