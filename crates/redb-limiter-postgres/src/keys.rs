//! Keys and permit strings as the database stores them.
//!
//! A key is any UTF-8 string of 1 to 512 bytes (wire, section 3), U+0000 included, and a permit
//! string any of 1 to 128 bytes; PostgreSQL's `text` and `jsonb` cannot hold U+0000. So every
//! key and permit string crosses to the database escaped, and every one that comes back is
//! unescaped:
//!
//! - U+0000 is written U+0001 U+0001;
//! - U+0001 is written U+0001 U+0002;
//! - every other character is written as it is.
//!
//! The codes are prefix-free and ordered as the bytes they stand for (00 < 01 < 02 ..), so the
//! escaping keeps what the schema relies on: two keys are equal, ordered (byte order, `COLLATE
//! "C"`) and one a prefix of the other exactly when their escaped forms are. `/state` pages by
//! escaped key therefore page in key order, and `starts_with` on escaped keys filters by
//! prefix. Escaping then unescaping gives the string back, for every string; a string that
//! holds neither character (nearly every key, and every permit this crate issues) is its own
//! escaped form and costs no copy.
//!
//! Schema format version 1 stored keys as they were (it could not hold U+0000); the migration
//! to version 2 (`sql/migrate/1-2.sql`) escapes the U+0001 they held.

use std::borrow::Cow;

/// The escape character.
const ESC: char = '\u{1}';

/// The escaped form of `s` (see the module docs).
#[must_use]
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.bytes().any(|b| b <= 1) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\0' => out.push_str("\u{1}\u{1}"),
            ESC => out.push_str("\u{1}\u{2}"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// The string whose escaped form is `s`; `None` when `s` is no escaped form (U+0001 followed by
/// anything but U+0001 or U+0002, or last).
#[must_use]
pub fn unescape(s: &str) -> Option<Cow<'_, str>> {
    if !s.contains(ESC) {
        return Some(Cow::Borrowed(s));
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == ESC {
            match chars.next()? {
                '\u{1}' => out.push('\0'),
                '\u{2}' => out.push(ESC),
                _ => return None,
            }
        } else {
            out.push(c);
        }
    }
    Some(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<String> {
        let mut v: Vec<String> =
            ["", "a", "\0", "\u{1}", "\u{2}", "\0\u{1}\u{2}", "a\0b", "a\u{1}b", "\u{1}\u{1}", "'\"\\%_"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
        v.push((0..=16u32).filter_map(|plane| char::from_u32((plane << 16) | 0x100)).collect());
        v.push("\0".repeat(512));
        v
    }

    #[test]
    fn every_string_round_trips() {
        for s in samples() {
            assert_eq!(unescape(&escape(&s)).as_deref(), Some(s.as_str()), "{s:?}");
        }
        assert!(!escape("a\0b").contains('\0'));
    }

    #[test]
    fn order_equality_and_prefixes_are_kept() {
        let all = samples();
        for a in &all {
            for b in &all {
                let (ea, eb) = (escape(a), escape(b));
                assert_eq!(a.as_bytes().cmp(b.as_bytes()), ea.as_bytes().cmp(eb.as_bytes()), "{a:?} {b:?}");
                assert_eq!(a.starts_with(b.as_str()), ea.starts_with(eb.as_ref()), "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn what_is_no_escaped_form_is_refused() {
        assert_eq!(unescape("a\u{1}"), None);
        assert_eq!(unescape("a\u{1}b"), None);
        assert_eq!(unescape("\u{1}\u{2}").as_deref(), Some("\u{1}"));
    }
}
