//! Permit ids: opaque on the wire, never reused, drawn from a seedable source.
//!
//! An id is a 64-bit nonce chosen when the engine starts plus a 64-bit sequence number, written
//! `p-` and 32 lowercase hex digits. The nonce comes from the caller (the limiter draws it from
//! the OS at open; tests pass a fixed seed), so a restart never issues an id it issued before.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct PermitId(pub u128);

impl fmt::Display for PermitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p-{:032x}", self.0)
    }
}

impl FromStr for PermitId {
    type Err = ();

    /// Reads an id this limiter wrote; any other string is not one of ours.
    fn from_str(s: &str) -> Result<Self, ()> {
        let hex = s.strip_prefix("p-").ok_or(())?;
        if hex.len() != 32 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(());
        }
        u128::from_str_radix(hex, 16).map(PermitId).map_err(|_| ())
    }
}

/// Issues ids `nonce << 64 | sequence`.
#[derive(Debug, Clone)]
pub(crate) struct PermitIds {
    nonce: u64,
    next: u64,
}

impl PermitIds {
    pub(crate) fn new(seed: u64) -> Self {
        // splitmix64, so that nearby seeds give unrelated nonces.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        PermitIds { nonce: z ^ (z >> 31), next: 0 }
    }

    pub(crate) fn next_id(&mut self) -> PermitId {
        let id = PermitId(u128::from(self.nonce) << 64 | u128::from(self.next));
        self.next += 1;
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_foreign_strings_are_not_ids() {
        let mut ids = PermitIds::new(7);
        let a = ids.next_id();
        let b = ids.next_id();
        assert_ne!(a, b);
        assert_eq!(a.to_string().parse::<PermitId>(), Ok(a));
        assert_eq!(a.to_string().len(), 34);
        for bad in [
            "",
            "p-",
            "x-00000000000000000000000000000000",
            "p-0000000000000000000000000000000G",
            "p-+0000000000000000000000000000000",
        ] {
            assert!(bad.parse::<PermitId>().is_err(), "{bad}");
        }
        assert_ne!(PermitIds::new(1).next_id(), PermitIds::new(2).next_id());
    }
}
