//! redb-limiter: a durable rate limiter in one redb file.
pub mod time;
pub mod vendor;
