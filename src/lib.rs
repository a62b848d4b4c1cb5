//! redb-limiter: a durable rate limiter in one redb file.
pub mod loadgen;
pub mod time;
