//! redb-limiter: a durable rate limiter in one redb file.
pub mod engine;
pub mod request;
pub mod time;
pub mod vendor;
