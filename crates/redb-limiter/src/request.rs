//! The three requests, validated: every bound of the wire spec lives here, next to the types.
//!
//! A value of [`AcquireRequest`], [`ReleaseRequest`] or [`ThrottleRequest`] is always within the
//! spec's bounds, so the engine never checks input again. Parsing from JSON happens here too
//! (from a `serde_json::Value`, so that every error names the field at fault, e.g.
//! `limits[1].perMs must be an integer from 1 to 2678400000`). This module never decides
//! anything: it only says whether a request is well formed.

use serde_json::{Map, Value};

use crate::time::{Millis, parse_instant};

pub const MAX_KEY_BYTES: usize = 512;
pub const MAX_LIMITS: usize = 64;
pub const MAX_CALLS: u64 = 1_000_000_000;
pub const MAX_PER_MS: u64 = 2_678_400_000;
pub const MAX_CONCURRENT: u64 = 1_000_000;
pub const MAX_COST: u64 = 1_000_000_000;
pub const MAX_HOLD_MS: u64 = 86_400_000;
pub const DEFAULT_HOLD_MS: u64 = 600_000;
pub const DEFAULT_COST: u64 = 1;
pub const MAX_PERMIT_BYTES: usize = 128;
/// A throttle may close a caller for at most this long ahead of `now`.
pub const MAX_THROTTLE_AHEAD_MS: u64 = 86_400_000;

/// A malformed request. The message names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

impl BadRequest {
    fn field(field: impl std::fmt::Display, rule: impl std::fmt::Display) -> Self {
        BadRequest(format!("{field} {rule}"))
    }
}

/// A rolling window: at most `calls` (counting cost) in any stretch of `per_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLimit {
    pub calls: u64,
    pub per_ms: u64,
}

/// One bucket a call counts in, with its defaults already resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub key: String,
    pub window: Option<WindowLimit>,
    pub concurrent: Option<u64>,
    /// What this call counts in this bucket's window (0 to 10^9).
    pub cost: u64,
    /// How long a place in this bucket lapses after the grant when never released.
    pub hold_ms: u64,
}

/// An `acquire`: the caller `key` and the buckets the call counts in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    pub key: String,
    pub limits: Vec<Limit>,
}

/// A `release` of a permit (any string of 1 to 128 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRequest {
    pub permit: String,
}

/// A `throttle`: close the caller `key` until `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottleRequest {
    pub key: String,
    pub until: Millis,
}

/// The name of a field inside `limits[at]` (the element itself when `name` is empty), written
/// out only when an error names it: a valid request formats no field names.
#[derive(Clone, Copy)]
struct LimitField<'a> {
    at: usize,
    name: &'a str,
}

impl std::fmt::Display for LimitField<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name {
            "" => write!(f, "limits[{}]", self.at),
            name => write!(f, "limits[{}].{name}", self.at),
        }
    }
}

fn check_key(field: impl std::fmt::Display, key: &str) -> Result<(), BadRequest> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(BadRequest::field(field, format_args!("must be a string of 1 to {MAX_KEY_BYTES} bytes")));
    }
    Ok(())
}

fn check_range(field: impl std::fmt::Display, value: u64, min: u64, max: u64) -> Result<u64, BadRequest> {
    if value < min || value > max {
        return Err(BadRequest::field(field, format_args!("must be an integer from {min} to {max}")));
    }
    Ok(value)
}

impl Limit {
    /// A window-only limit with the request defaults (cost 1).
    #[must_use]
    pub fn window(key: impl Into<String>, calls: u64, per_ms: u64) -> Self {
        Limit {
            key: key.into(),
            window: Some(WindowLimit { calls, per_ms }),
            concurrent: None,
            cost: DEFAULT_COST,
            hold_ms: DEFAULT_HOLD_MS,
        }
    }

    /// A concurrency-only limit with the request defaults.
    #[must_use]
    pub fn concurrent(key: impl Into<String>, concurrent: u64) -> Self {
        Limit {
            key: key.into(),
            window: None,
            concurrent: Some(concurrent),
            cost: DEFAULT_COST,
            hold_ms: DEFAULT_HOLD_MS,
        }
    }

    #[must_use]
    pub fn with_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    #[must_use]
    pub fn with_hold_ms(mut self, hold_ms: u64) -> Self {
        self.hold_ms = hold_ms;
        self
    }

    #[must_use]
    pub fn with_concurrent(mut self, concurrent: u64) -> Self {
        self.concurrent = Some(concurrent);
        self
    }

    fn validate(&self, at: usize) -> Result<(), BadRequest> {
        let f = |name| LimitField { at, name };
        check_key(f("key"), &self.key)?;
        if let Some(w) = self.window {
            check_range(f("calls"), w.calls, 1, MAX_CALLS)?;
            check_range(f("perMs"), w.per_ms, 1, MAX_PER_MS)?;
        }
        if let Some(c) = self.concurrent {
            check_range(f("concurrent"), c, 1, MAX_CONCURRENT)?;
        }
        if self.window.is_none() && self.concurrent.is_none() {
            return Err(BadRequest::field(f(""), "must have a window (calls and perMs), a concurrent, or both"));
        }
        check_range(f("cost"), self.cost, 0, MAX_COST)?;
        check_range(f("holdMs"), self.hold_ms, 1, MAX_HOLD_MS)?;
        Ok(())
    }
}

impl AcquireRequest {
    /// Builds a request and checks every bound.
    pub fn new(key: impl Into<String>, limits: Vec<Limit>) -> Result<Self, BadRequest> {
        let req = AcquireRequest { key: key.into(), limits };
        req.validate()?;
        Ok(req)
    }

    /// Checks every bound of the spec's acquire table.
    pub fn validate(&self) -> Result<(), BadRequest> {
        check_key("key", &self.key)?;
        if self.limits.len() > MAX_LIMITS {
            return Err(BadRequest::field("limits", format_args!("must have at most {MAX_LIMITS} entries")));
        }
        for (i, limit) in self.limits.iter().enumerate() {
            limit.validate(i)?;
            if self.limits[..i].iter().any(|l| l.key == limit.key) {
                return Err(BadRequest::field(LimitField { at: i, name: "key" }, "must be unique within the request"));
            }
        }
        Ok(())
    }

    /// Parses the JSON params of an `acquire`. Unknown fields are ignored.
    pub fn from_json(params: &Value) -> Result<Self, BadRequest> {
        let obj = object(params, "params")?;
        let key = required_str(obj, "key", "key")?;
        let cost = optional_int(obj, "cost", "cost", 0, MAX_COST)?.unwrap_or(DEFAULT_COST);
        let hold_ms = optional_int(obj, "holdMs", "holdMs", 1, MAX_HOLD_MS)?.unwrap_or(DEFAULT_HOLD_MS);
        let raw_limits = match obj.get("limits") {
            Some(Value::Array(items)) => items,
            Some(_) => return Err(BadRequest::field("limits", "must be an array")),
            None => return Err(BadRequest::field("limits", "is required")),
        };
        if raw_limits.len() > MAX_LIMITS {
            return Err(BadRequest::field("limits", format_args!("must have at most {MAX_LIMITS} entries")));
        }
        let mut limits = Vec::with_capacity(raw_limits.len());
        for (i, raw) in raw_limits.iter().enumerate() {
            let f = |name| LimitField { at: i, name };
            let lim = object(raw, f(""))?;
            let key = required_str(lim, "key", f("key"))?;
            let calls = optional_int(lim, "calls", f("calls"), 1, MAX_CALLS)?;
            let per_ms = optional_int(lim, "perMs", f("perMs"), 1, MAX_PER_MS)?;
            let window = match (calls, per_ms) {
                (Some(calls), Some(per_ms)) => Some(WindowLimit { calls, per_ms }),
                (None, None) => None,
                (Some(_), None) => return Err(BadRequest::field(f("perMs"), "is required with calls")),
                (None, Some(_)) => return Err(BadRequest::field(f("calls"), "is required with perMs")),
            };
            limits.push(Limit {
                key: key.to_owned(),
                window,
                concurrent: optional_int(lim, "concurrent", f("concurrent"), 1, MAX_CONCURRENT)?,
                cost: optional_int(lim, "cost", f("cost"), 0, MAX_COST)?.unwrap_or(cost),
                hold_ms: optional_int(lim, "holdMs", f("holdMs"), 1, MAX_HOLD_MS)?.unwrap_or(hold_ms),
            });
        }
        AcquireRequest::new(key, limits)
    }
}

impl ReleaseRequest {
    pub fn new(permit: impl Into<String>) -> Result<Self, BadRequest> {
        let permit = permit.into();
        if permit.is_empty() || permit.len() > MAX_PERMIT_BYTES {
            return Err(BadRequest::field("permit", format_args!("must be a string of 1 to {MAX_PERMIT_BYTES} bytes")));
        }
        Ok(ReleaseRequest { permit })
    }

    pub fn from_json(params: &Value) -> Result<Self, BadRequest> {
        let obj = object(params, "params")?;
        ReleaseRequest::new(required_str(obj, "permit", "permit")?)
    }
}

impl ThrottleRequest {
    /// Builds a throttle request; `until` may be in the past (it then changes nothing) but not
    /// more than 24 hours after `now`.
    pub fn new(key: impl Into<String>, until: Millis, now: Millis) -> Result<Self, BadRequest> {
        let key = key.into();
        check_key("key", &key)?;
        if until > now.plus(MAX_THROTTLE_AHEAD_MS) {
            return Err(BadRequest::field("until", "must be at most 24 hours ahead"));
        }
        Ok(ThrottleRequest { key, until })
    }

    pub fn from_json(params: &Value, now: Millis) -> Result<Self, BadRequest> {
        let obj = object(params, "params")?;
        let key = required_str(obj, "key", "key")?;
        let until = match obj.get("until") {
            Some(Value::String(s)) => parse_instant(s).map_err(|e| BadRequest::field("until", e))?,
            Some(_) => return Err(BadRequest::field("until", "must be an instant string")),
            None => return Err(BadRequest::field("until", "is required")),
        };
        ThrottleRequest::new(key, until, now)
    }
}

fn object(v: &Value, field: impl std::fmt::Display) -> Result<&Map<String, Value>, BadRequest> {
    v.as_object().ok_or_else(|| BadRequest::field(field, "must be a JSON object"))
}

fn required_str<'a>(
    obj: &'a Map<String, Value>,
    name: &str,
    field: impl std::fmt::Display,
) -> Result<&'a str, BadRequest> {
    match obj.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(BadRequest::field(field, "must be a string")),
        None => Err(BadRequest::field(field, "is required")),
    }
}

/// An optional JSON integer (no fraction, no exponent, not negative) within `min..=max`.
fn optional_int(
    obj: &Map<String, Value>,
    name: &str,
    field: impl std::fmt::Display,
    min: u64,
    max: u64,
) -> Result<Option<u64>, BadRequest> {
    match obj.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) => check_range(field, v, min, max).map(Some),
            None => Err(BadRequest::field(field, format_args!("must be an integer from {min} to {max}"))),
        },
        Some(_) => Err(BadRequest::field(field, format_args!("must be an integer from {min} to {max}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        AcquireRequest::from_json(&v).unwrap_err().0
    }

    #[test]
    fn parses_the_spec_example_with_defaults() {
        let req = AcquireRequest::from_json(&json!({
            "key": "anthropic/cred:42", "cost": 1, "holdMs": 600000, "extra": true,
            "limits": [
                { "key": "anthropic/team:7/rpm", "calls": 50, "perMs": 60000 },
                { "key": "anthropic/team:7/tpm", "calls": 40000, "perMs": 60000, "cost": 1234 },
                { "key": "anthropic/team:7/conc", "concurrent": 4, "holdMs": 120000 }
            ]
        }))
        .unwrap();
        assert_eq!(req.key, "anthropic/cred:42");
        assert_eq!(req.limits[0].cost, 1);
        assert_eq!(req.limits[1].cost, 1234);
        assert_eq!(req.limits[1].window, Some(WindowLimit { calls: 40000, per_ms: 60000 }));
        assert_eq!(req.limits[2].concurrent, Some(4));
        assert_eq!(req.limits[2].hold_ms, 120000);
        assert_eq!(req.limits[0].hold_ms, 600000);
    }

    #[test]
    fn every_error_names_its_field() {
        assert_eq!(err(json!({"limits": []})), "key is required");
        assert_eq!(err(json!({"key": "", "limits": []})), "key must be a string of 1 to 512 bytes");
        assert_eq!(err(json!({"key": "a".repeat(513), "limits": []})), "key must be a string of 1 to 512 bytes");
        assert_eq!(err(json!({"key": "k"})), "limits is required");
        assert_eq!(err(json!({"key": "k", "limits": {}})), "limits must be an array");
        assert_eq!(
            err(
                json!({"key": "k", "limits": [{"key": "a", "calls": 1, "perMs": 1}, {"key": "b", "calls": 1, "perMs": 0}]})
            ),
            "limits[1].perMs must be an integer from 1 to 2678400000"
        );
        assert_eq!(
            err(json!({"key": "k", "limits": [{"key": "a", "calls": 5.0, "perMs": 1}]})),
            "limits[0].calls must be an integer from 1 to 1000000000"
        );
        assert_eq!(
            err(json!({"key": "k", "limits": [{"key": "a", "calls": "5", "perMs": 1}]})),
            "limits[0].calls must be an integer from 1 to 1000000000"
        );
        assert_eq!(
            err(json!({"key": "k", "limits": [{"key": "a", "calls": -1, "perMs": 1}]})),
            "limits[0].calls must be an integer from 1 to 1000000000"
        );
        assert_eq!(
            err(json!({"key": "k", "limits": [{"key": "a", "calls": 5}]})),
            "limits[0].perMs is required with calls"
        );
        assert_eq!(
            err(json!({"key": "k", "limits": [{"key": "a", "perMs": 5}]})),
            "limits[0].calls is required with perMs"
        );
        assert_eq!(
            err(json!({"key": "k", "limits": [{"key": "a"}]})),
            "limits[0] must have a window (calls and perMs), a concurrent, or both"
        );
        assert_eq!(
            err(json!({"key": "k", "limits": [{"key": "a", "concurrent": 0}]})),
            "limits[0].concurrent must be an integer from 1 to 1000000"
        );
        assert_eq!(
            err(json!({"key": "k", "limits": [{"key": "a", "concurrent": 1}, {"key": "a", "concurrent": 1}]})),
            "limits[1].key must be unique within the request"
        );
        assert_eq!(err(json!({"key": "k", "cost": 1e3, "limits": []})), "cost must be an integer from 0 to 1000000000");
        assert_eq!(err(json!({"key": "k", "holdMs": 0, "limits": []})), "holdMs must be an integer from 1 to 86400000");
        let many: Vec<Value> = (0..65).map(|i| json!({"key": format!("b{i}"), "concurrent": 1})).collect();
        assert_eq!(err(json!({"key": "k", "limits": many})), "limits must have at most 64 entries");
        assert_eq!(err(json!([1])), "params must be a JSON object");
    }

    #[test]
    fn release_and_throttle_bounds() {
        assert!(ReleaseRequest::from_json(&json!({"permit": "x"})).is_ok());
        assert_eq!(
            ReleaseRequest::from_json(&json!({"permit": ""})).unwrap_err().0,
            "permit must be a string of 1 to 128 bytes"
        );
        assert_eq!(ReleaseRequest::from_json(&json!({"permit": 5})).unwrap_err().0, "permit must be a string");
        assert_eq!(ReleaseRequest::from_json(&json!({})).unwrap_err().0, "permit is required");
        let now = parse_instant("2026-11-30T00:00:00Z").unwrap();
        let t = ThrottleRequest::from_json(&json!({"key": "c", "until": "2026-11-30T01:00:00+01:00"}), now).unwrap();
        assert_eq!(t.until, now);
        assert_eq!(
            ThrottleRequest::from_json(&json!({"key": "c", "until": "2026-12-01T00:00:00.001Z"}), now).unwrap_err().0,
            "until must be at most 24 hours ahead"
        );
        assert!(ThrottleRequest::from_json(&json!({"key": "c", "until": "2026-12-01T00:00:00.000Z"}), now).is_ok());
        assert!(
            ThrottleRequest::from_json(&json!({"key": "c", "until": "tomorrow"}), now)
                .unwrap_err()
                .0
                .starts_with("until must be")
        );
    }
}

/// The three methods of the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Acquire,
    Release,
    Throttle,
}

impl Method {
    /// The method named on the wire (`acquire`, `release`, `throttle`).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Method> {
        match name {
            "acquire" => Some(Method::Acquire),
            "release" => Some(Method::Release),
            "throttle" => Some(Method::Throttle),
            _ => None,
        }
    }

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Method::Acquire => "acquire",
            Method::Release => "release",
            Method::Throttle => "throttle",
        }
    }
}

/// Any one validated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Acquire(AcquireRequest),
    Release(ReleaseRequest),
    Throttle(ThrottleRequest),
}

/// Why an envelope (`POST /` with `{method, params}`) is not a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("{0}")]
    BadRequest(#[from] BadRequest),
    /// The envelope names a method the wire does not have (a 404, not a 400).
    #[error("unknown method {0:?}")]
    UnknownMethod(String),
}

fn parse_json(body: &[u8]) -> Result<Value, BadRequest> {
    serde_json::from_slice(body).map_err(|e| BadRequest::field("body", format_args!("is not valid JSON: {e}")))
}

impl Request {
    /// Parses the params of `method` from `params`; `now` bounds a throttle's `until`.
    pub fn from_params(method: Method, params: &Value, now: Millis) -> Result<Request, BadRequest> {
        Ok(match method {
            Method::Acquire => Request::Acquire(AcquireRequest::from_json(params)?),
            Method::Release => Request::Release(ReleaseRequest::from_json(params)?),
            Method::Throttle => Request::Throttle(ThrottleRequest::from_json(params, now)?),
        })
    }

    /// Parses a direct call's body (`POST /acquire` and the like).
    pub fn from_body(method: Method, body: &[u8], now: Millis) -> Result<Request, BadRequest> {
        Request::from_params(method, &parse_json(body)?, now)
    }

    /// Parses an envelope body `{"method": ..., "params": {...}}`. The params' errors read
    /// exactly as on the direct path.
    pub fn from_envelope(body: &[u8], now: Millis) -> Result<Request, EnvelopeError> {
        let value = parse_json(body)?;
        let obj = object(&value, "body")?;
        let name = required_str(obj, "method", "method")?;
        let method = Method::from_name(name).ok_or_else(|| EnvelopeError::UnknownMethod(name.to_owned()))?;
        let params = obj.get("params").ok_or_else(|| BadRequest::field("params", "is required"))?;
        Ok(Request::from_params(method, params, now)?)
    }
}

#[cfg(test)]
mod envelope_tests {
    use super::*;

    #[test]
    fn the_envelope_answers_like_the_direct_path() {
        let now = Millis(1_800_000_000_000);
        let params = br#"{"key":"k","limits":[{"key":"b","calls":1,"perMs":0}]}"#;
        let direct = Request::from_body(Method::Acquire, params, now).unwrap_err();
        let envelope = format!(r#"{{"method":"acquire","params":{}}}"#, std::str::from_utf8(params).unwrap());
        assert_eq!(Request::from_envelope(envelope.as_bytes(), now), Err(EnvelopeError::BadRequest(direct)));
        assert_eq!(
            Request::from_envelope(br#"{"method":"nope","params":{}}"#, now),
            Err(EnvelopeError::UnknownMethod("nope".into()))
        );
        assert_eq!(
            Request::from_envelope(br#"{"method":"release"}"#, now),
            Err(EnvelopeError::BadRequest(BadRequest("params is required".into())))
        );
        assert!(Request::from_body(Method::Release, b"{", now).unwrap_err().0.starts_with("body is not valid JSON"));
        assert_eq!(
            Request::from_envelope(br#"{"method":"release","params":{"permit":"p"}}"#, now),
            Ok(Request::Release(ReleaseRequest { permit: "p".into() }))
        );
    }

    #[test]
    fn params_nested_to_the_depth_limit_are_bad_requests_on_both_paths() {
        // The `wire_decode` fuzz target allows for this. The envelope nests the params one level
        // deeper, so at serde_json's depth limit only the envelope's body is too deep: the
        // messages differ, but both are bad requests and neither panics.
        let now = Millis(1_800_000_000_000);
        let deep = format!("{}{}", "[".repeat(127), "]".repeat(127));
        let direct = Request::from_body(Method::Acquire, deep.as_bytes(), now).unwrap_err();
        assert_eq!(direct.0, "params must be a JSON object");
        let envelope = format!(r#"{{"method":"acquire","params":{deep}}}"#);
        match Request::from_envelope(envelope.as_bytes(), now) {
            Err(EnvelopeError::BadRequest(e)) => assert!(e.0.starts_with("body is not valid JSON"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}

impl AcquireRequest {
    /// The request in the wire's JSON form (every default written out).
    #[must_use]
    pub fn to_json(&self) -> Value {
        let limits: Vec<Value> = self
            .limits
            .iter()
            .map(|l| {
                let mut m = Map::new();
                m.insert("key".into(), Value::from(l.key.clone()));
                if let Some(w) = l.window {
                    m.insert("calls".into(), Value::from(w.calls));
                    m.insert("perMs".into(), Value::from(w.per_ms));
                }
                if let Some(c) = l.concurrent {
                    m.insert("concurrent".into(), Value::from(c));
                }
                m.insert("cost".into(), Value::from(l.cost));
                m.insert("holdMs".into(), Value::from(l.hold_ms));
                Value::Object(m)
            })
            .collect();
        serde_json::json!({ "key": self.key, "limits": limits })
    }
}

#[cfg(test)]
mod to_json_tests {
    use super::*;

    #[test]
    fn to_json_round_trips() {
        let req = AcquireRequest::new(
            "c",
            vec![
                Limit::window("w", 5, 1000).with_cost(3),
                Limit::concurrent("k", 2).with_hold_ms(9),
                Limit::window("both", 1, 2).with_concurrent(4),
            ],
        )
        .unwrap();
        assert_eq!(AcquireRequest::from_json(&req.to_json()), Ok(req));
    }
}
