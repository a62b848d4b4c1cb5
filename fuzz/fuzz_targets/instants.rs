//! Instants both ways. Arbitrary strings through `parse_instant`: never a panic, and every
//! accepted instant formats back in `toISOString` form (`YYYY-MM-DDTHH:MM:SS.mmmZ`, 24 chars)
//! and reparses to the same millisecond. Arbitrary milliseconds through `format_instant`: never a
//! panic, always that form, and up to `MAX_INSTANT` a round trip.

#![no_main]

use libfuzzer_sys::fuzz_target;
use redb_limiter::Millis;
use redb_limiter::time::{MAX_INSTANT, format_instant, parse_instant};

/// Whether `s` is exactly `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn is_iso_string(s: &str) -> bool {
    const FORM: &[u8; 24] = b"dddd-dd-ddTdd:dd:dd.dddZ";
    s.len() == FORM.len() && s.bytes().zip(FORM).all(|(c, &f)| if f == b'd' { c.is_ascii_digit() } else { c == f })
}

fuzz_target!(|data: &[u8]| {
    if let Some(bytes) = data.first_chunk::<8>() {
        let at = Millis(u64::from_le_bytes(*bytes));
        let text = format_instant(at);
        assert!(is_iso_string(&text), "{at:?} formatted as {text:?}");
        let expected = at.min(MAX_INSTANT);
        assert_eq!(parse_instant(&text), Ok(expected), "{at:?} formatted as {text:?}");
    }
    let Ok(s) = std::str::from_utf8(data) else { return };
    let Ok(at) = parse_instant(s) else { return };
    assert!(at <= MAX_INSTANT, "{s:?} parsed to {at:?}, after the latest instant");
    let text = format_instant(at);
    assert!(is_iso_string(&text), "{s:?} parsed to {at:?}, formatted as {text:?}");
    assert_eq!(parse_instant(&text), Ok(at), "{s:?} formatted as {text:?}");
});
