//! Permit ids: opaque on the wire, never reused, drawn from a seedable source.
//!
//! An id is a 64-bit random part of its own plus a 64-bit sequence number, written `p-` and 32
//! lowercase hex digits. The random part is SipHash-2-4 of the sequence number under a key
//! of 128 bits from the operating system's random source (tests pass a fixed 64-bit seed, from
//! which the key is derived, to get the same ids each run), so
//! the ids already seen tell nothing of the next one's random part: a permit cannot be guessed
//! and released by someone who did not get it. A restart draws a new key, so it never issues an
//! id it issued before (but with the chance of a 64-bit collision).

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

/// Issues ids `random << 64 | sequence`, the random part a keyed hash of the sequence.
#[derive(Debug, Clone)]
pub(crate) struct PermitIds {
    key: (u64, u64),
    next: u64,
}

/// splitmix64's output function, so that nearby seeds give unrelated keys.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl PermitIds {
    pub(crate) fn new(seed: u64) -> Self {
        PermitIds { key: (mix(seed), mix(seed ^ 0x5851_f42d_4c95_7f2d)), next: 0 }
    }

    /// Replaces the key with 128 bits from the operating system's random source, so that the
    /// random parts cannot be found from a 64-bit seed. The sequence goes on as it was.
    pub(crate) fn rekey_from_os(&mut self) -> std::io::Result<()> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| std::io::Error::other(format!("permit ids: no random key from the OS: {e}")))?;
        let (a, b) = bytes.split_at(8);
        self.key = (
            u64::from_le_bytes(a.try_into().unwrap_or_default()),
            u64::from_le_bytes(b.try_into().unwrap_or_default()),
        );
        Ok(())
    }

    pub(crate) fn next_id(&mut self) -> PermitId {
        use std::hash::Hasher;
        let mut hasher = siphasher::sip::SipHasher24::new_with_keys(self.key.0, self.key.1);
        hasher.write_u64(self.next);
        let id = PermitId(u128::from(hasher.finish()) << 64 | u128::from(self.next));
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

    /// Each id has a random part of its own: not a prefix shared by a run's ids, not a counter,
    /// and not found from the ids before it; the same seed gives the same ids (tests rely on it).
    #[test]
    fn every_id_has_a_random_part_of_its_own() {
        let high = |id: PermitId| (id.0 >> 64) as u64;
        let mut ids = PermitIds::new(7);
        let run: Vec<PermitId> = (0..1000).map(|_| ids.next_id()).collect();
        let parts: std::collections::BTreeSet<u64> = run.iter().map(|id| high(*id)).collect();
        assert_eq!(parts.len(), run.len(), "no two ids share their random part");
        for pair in run.windows(2) {
            let (a, b) = (high(pair[0]), high(pair[1]));
            assert!((a ^ b).count_ones() > 10, "consecutive random parts unrelated: {a:x} {b:x}");
            assert_eq!(pair[1].0 as u64, pair[0].0 as u64 + 1, "the low half still counts");
        }
        let mut again = PermitIds::new(7);
        assert!(run.iter().all(|id| *id == again.next_id()), "a seed gives the same ids");
        let mut other = PermitIds::new(8);
        assert_ne!(high(other.next_id()), high(run[0]));
    }

    /// Unseeded, the key is 128 bits of the OS's: two draws differ in both halves, and the ids
    /// under it are not those of the seed the engine was made with.
    #[test]
    fn an_unseeded_key_is_drawn_from_the_os_in_full() {
        let mut a = PermitIds::new(7);
        let mut b = PermitIds::new(7);
        a.rekey_from_os().unwrap();
        b.rekey_from_os().unwrap();
        assert_ne!(a.key.0, b.key.0);
        assert_ne!(a.key.1, b.key.1);
        let seeded = PermitIds::new(7).next_id();
        let drawn = a.next_id();
        assert_ne!(drawn, seeded);
        assert_eq!(drawn.0 as u64, seeded.0 as u64, "the sequence goes on as it was");
    }
}
