//! The requests, validated: every bound of the wire spec lives here, next to the types.
//!
//! A value of [`AcquireRequest`] (also a `peek`'s params), [`ReleaseRequest`],
//! [`ThrottleRequest`], [`SettleRequest`] or [`LiftRequest`] is always within the spec's bounds,
//! so the engine never checks input again (but for what only the state can tell: whether a
//! settled key was a window of the permit's grant). Parsing from JSON happens here too
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
/// A ticket (section 12) is any string of 1 to this many bytes on input.
pub const MAX_TICKET_BYTES: usize = 128;
/// A ticket lapses this long after its latest `retryAt` unless asked again (section 12.4).
pub const DEFAULT_GRACE_MS: u64 = 2_000;
pub const MIN_GRACE_MS: u64 = 100;
pub const MAX_GRACE_MS: u64 = 60_000;
/// The longest `maxWaitMs` an acquire may give (section 12.9): a day.
pub const MAX_WAIT_MS: u64 = 86_400_000;
/// A request id (section 16) is any string of 1 to this many bytes.
pub const MAX_ID_BYTES: usize = 128;
/// A `/wait` (section 15) names 1 to this many tickets...
pub const MAX_WAIT_TICKETS: usize = 64;
/// ...and answers at `timeoutMs` at the latest, within these bounds.
pub const MIN_WAIT_TIMEOUT_MS: u64 = 1_000;
pub const MAX_WAIT_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_WAIT_TIMEOUT_MS: u64 = 25_000;
/// An adaptive ceiling's `increase` (section 14) is at most this.
pub const MAX_INCREASE: u64 = 1_000_000;
/// A cut keeps this share of the ceiling unless `keepPct` says otherwise (section 14).
pub const DEFAULT_KEEP_PCT: u64 = 50;

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

/// A token bucket (section 13): `refill` tokens every `per_ms`, added continuously, up to
/// `burst`; `initial` is its level the first time an acquire names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketLimit {
    pub refill: u64,
    pub per_ms: u64,
    pub burst: u64,
    pub initial: u64,
}

impl BucketLimit {
    /// `refill` per `per_ms`, starting full, with a burst of `refill`.
    #[must_use]
    pub fn new(refill: u64, per_ms: u64) -> Self {
        BucketLimit { refill, per_ms, burst: refill, initial: refill }
    }
}

/// An adaptive ceiling (section 14) on a window's `calls` or a token bucket's `refill`: the
/// bucket is judged with a ceiling `C` kept by the limiter, clamped to `[min, max]`, which a
/// `limited` outcome cuts to `keepPct` percent and a `clean` one raises by `increase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adapt {
    pub min: u64,
    pub max: u64,
    pub increase: u64,
    pub keep_pct: u64,
}

impl Adapt {
    /// The spec's defaults for a limit of `calls` (a bucket's `refill`): `min` a tenth of it (at
    /// least 1), `max` itself, `increase` 1, `keepPct` 50.
    #[must_use]
    pub fn defaults(calls: u64) -> Self {
        Adapt { min: (calls / 10).max(1), max: calls, increase: 1, keep_pct: DEFAULT_KEEP_PCT }
    }

    /// `c` within this request's `[min, max]`.
    #[must_use]
    pub fn clamp(&self, c: u64) -> u64 {
        c.clamp(self.min, self.max)
    }

    /// Checks the bounds against the limit's own `calls` (a bucket's `refill`), naming each
    /// field inside `limits[at].adapt`.
    fn validate(&self, at: usize, calls: u64) -> Result<(), BadRequest> {
        let f = |name| LimitField { at, name };
        check_range(f("adapt.min"), self.min, 1, calls)?;
        check_range(f("adapt.max"), self.max, calls, MAX_CALLS)?;
        check_range(f("adapt.increase"), self.increase, 0, MAX_INCREASE)?;
        check_range(f("adapt.keepPct"), self.keep_pct, 1, 99)?;
        Ok(())
    }

    fn to_json(self) -> Value {
        serde_json::json!({ "min": self.min, "max": self.max, "increase": self.increase, "keepPct": self.keep_pct })
    }
}

/// What became of a call made under a permit (section 14): the provider served it, or
/// answered that a limit was hit (a 429).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    Clean,
    Limited,
}

impl Signal {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Clean => "clean",
            Signal::Limited => "limited",
        }
    }

    /// The signal a wire string names, the inverse of [`Signal::as_str`].
    #[must_use]
    pub fn parse(s: &str) -> Option<Signal> {
        [Signal::Clean, Signal::Limited].into_iter().find(|o| o.as_str() == s)
    }
}

/// The optional `outcome` of a release or settle.
fn parse_outcome(obj: &Map<String, Value>) -> Result<Option<Signal>, BadRequest> {
    match obj.get("outcome") {
        None => Ok(None),
        Some(Value::String(s)) if Signal::parse(s).is_some() => Ok(Signal::parse(s)),
        Some(_) => Err(BadRequest::field("outcome", "must be \"clean\" or \"limited\"")),
    }
}

/// One bucket a call counts in, with its defaults already resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub key: String,
    /// A rolling window (`calls` per `perMs`); never with `bucket`.
    pub window: Option<WindowLimit>,
    /// A token bucket (`refill` per `perMs`, section 13); never with `window`.
    pub bucket: Option<BucketLimit>,
    pub concurrent: Option<u64>,
    /// What this call counts in this bucket's window (0 to 10^9).
    pub cost: u64,
    /// How long a place in this bucket lapses after the grant when never released.
    pub hold_ms: u64,
    /// An adaptive ceiling on its window's `calls` or its bucket's `refill` (section 14).
    pub adapt: Option<Adapt>,
}

/// An `acquire` (or a `peek`): the caller `key` and the buckets the call counts in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    pub key: String,
    pub limits: Vec<Limit>,
    /// The request's own `holdMs`: how long a permit asked for with `permit` lives when it holds
    /// no place that lapses later.
    pub hold_ms: u64,
    /// Answer with the figures of each limit after the decision (section 9.2).
    pub report: bool,
    /// Give a grant a permit even when it holds no concurrency place (section 9.3).
    pub permit: bool,
    /// File a ticket when refused for `rate` or `concurrency` (section 12.1).
    pub queue: bool,
    /// The ticket a refusal named, asking again with it (section 12.3; `queue` is then implied).
    pub ticket: Option<String>,
    /// A ticket lapses this long after its latest `retryAt` (section 12.4); not bound by it.
    pub grace_ms: u64,
    /// How long this host is willing to wait (section 12.9, `maxWaitMs`): a ticket is filed only
    /// when the request's own instant lies within it (and the server's horizon); not bound by
    /// the ticket.
    pub max_wait_ms: Option<u64>,
    /// The host's name for this ask (section 16): a retry with it after a lost answer is
    /// answered as the first time, and `release {id}` undoes what it got.
    pub id: Option<String>,
}

/// One entry of a settle's `costs`: the grant's cost in the window bucket `key` becomes `cost`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cost {
    pub key: String,
    pub cost: u64,
}

/// A `release` of a ticket (section 12.4): the ticket leaves every line it waits in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveRequest {
    /// Any string of 1 to 128 bytes.
    pub ticket: String,
}

/// A `release` of a request id (section 16): undoes what that acquire got, settling the
/// windows of its grant to `costs` first when given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoRequest {
    /// Any string of 1 to 128 bytes.
    pub id: String,
    /// Empty: places and ticket only.
    pub costs: Vec<Cost>,
}

/// A `/wait` (section 15): answered when one of `tickets` is ready or gone, or at `timeout_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitRequest {
    /// 1 to 64 strings of 1 to 128 bytes.
    pub tickets: Vec<String>,
    pub timeout_ms: u64,
}

impl WaitRequest {
    pub fn new(tickets: Vec<String>, timeout_ms: u64) -> Result<Self, BadRequest> {
        if tickets.is_empty() || tickets.len() > MAX_WAIT_TICKETS {
            return Err(BadRequest::field("tickets", format_args!("must have 1 to {MAX_WAIT_TICKETS} entries")));
        }
        for (i, t) in tickets.iter().enumerate() {
            if t.is_empty() || t.len() > MAX_TICKET_BYTES {
                return Err(BadRequest::field(
                    format_args!("tickets[{i}]"),
                    format_args!("must be a string of 1 to {MAX_TICKET_BYTES} bytes"),
                ));
            }
        }
        check_range("timeoutMs", timeout_ms, MIN_WAIT_TIMEOUT_MS, MAX_WAIT_TIMEOUT_MS)?;
        Ok(WaitRequest { tickets, timeout_ms })
    }

    pub fn from_json(params: &Value) -> Result<Self, BadRequest> {
        let obj = object(params, "params")?;
        let tickets = match obj.get("tickets") {
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, t)| match t {
                    Value::String(t) => Ok(t.clone()),
                    _ => Err(BadRequest::field(
                        format_args!("tickets[{i}]"),
                        format_args!("must be a string of 1 to {MAX_TICKET_BYTES} bytes"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(BadRequest::field("tickets", "must be an array")),
            None => return Err(BadRequest::field("tickets", "is required")),
        };
        let timeout_ms = optional_int(obj, "timeoutMs", "timeoutMs", MIN_WAIT_TIMEOUT_MS, MAX_WAIT_TIMEOUT_MS)?
            .unwrap_or(DEFAULT_WAIT_TIMEOUT_MS);
        WaitRequest::new(tickets, timeout_ms)
    }

    /// The request in the wire's JSON form.
    #[must_use]
    pub fn to_json(&self) -> Value {
        serde_json::json!({ "tickets": self.tickets, "timeoutMs": self.timeout_ms })
    }
}

/// A `release` of a permit (any string of 1 to 128 bytes), settling `costs` first when given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRequest {
    pub permit: String,
    /// Empty: a plain release.
    pub costs: Vec<Cost>,
    /// What became of the call (section 14), for the adapted buckets of the permit's grant.
    pub outcome: Option<Signal>,
}

/// A `settle`: the real costs of a permit's grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleRequest {
    pub permit: String,
    /// 1 to 64 entries, keys unique.
    pub costs: Vec<Cost>,
    /// What became of the call (section 14), for the adapted buckets of the permit's grant.
    pub outcome: Option<Signal>,
}

/// A `lift`: end the throttle of caller `key` now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiftRequest {
    pub key: String,
}

/// A `throttle`: close the caller `key` until `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottleRequest {
    pub key: String,
    pub until: Millis,
    /// The permit whose call was limited (section 14): a `limited` outcome for its buckets.
    pub permit: Option<String>,
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
            bucket: None,
            concurrent: None,
            cost: DEFAULT_COST,
            hold_ms: DEFAULT_HOLD_MS,
            adapt: None,
        }
    }

    /// A concurrency-only limit with the request defaults.
    #[must_use]
    pub fn concurrent(key: impl Into<String>, concurrent: u64) -> Self {
        Limit {
            key: key.into(),
            window: None,
            bucket: None,
            concurrent: Some(concurrent),
            cost: DEFAULT_COST,
            hold_ms: DEFAULT_HOLD_MS,
            adapt: None,
        }
    }

    /// A token-bucket limit (section 13) with the request defaults (cost 1): `refill` tokens
    /// every `per_ms`, a burst of `refill`, starting full.
    #[must_use]
    pub fn bucket(key: impl Into<String>, refill: u64, per_ms: u64) -> Self {
        Limit {
            key: key.into(),
            window: None,
            bucket: Some(BucketLimit::new(refill, per_ms)),
            concurrent: None,
            cost: DEFAULT_COST,
            hold_ms: DEFAULT_HOLD_MS,
            adapt: None,
        }
    }

    /// Sets a bucket's `burst`, and its `initial` to it (a bucket starts full unless
    /// [`Limit::with_initial`] follows). No effect on a limit without a bucket.
    #[must_use]
    pub fn with_burst(mut self, burst: u64) -> Self {
        if let Some(b) = &mut self.bucket {
            b.burst = burst;
            b.initial = burst;
        }
        self
    }

    /// Sets a bucket's `initial` level. No effect on a limit without a bucket.
    #[must_use]
    pub fn with_initial(mut self, initial: u64) -> Self {
        if let Some(b) = &mut self.bucket {
            b.initial = initial;
        }
        self
    }

    /// What a grant takes from this limit's window or bucket: its cost, capped at `calls` or
    /// `burst` (rule 2, rule B); 0 for a limit with neither.
    #[must_use]
    pub fn counted_cost(&self) -> u64 {
        match (self.window, self.bucket) {
            (Some(w), _) => self.cost.min(w.calls),
            (None, Some(b)) => self.cost.min(b.burst),
            (None, None) => 0,
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

    /// Adapts the window's `calls` (a bucket's `refill`) to a shared ceiling (section 14).
    #[must_use]
    pub fn with_adapt(mut self, adapt: Adapt) -> Self {
        self.adapt = Some(adapt);
        self
    }

    /// The figure a ceiling stands for: the window's `calls`, or the bucket's `refill`.
    #[must_use]
    pub fn nominal_calls(&self) -> Option<u64> {
        self.window.map(|w| w.calls).or(self.bucket.map(|b| b.refill))
    }

    pub(crate) fn validate(&self, at: usize) -> Result<(), BadRequest> {
        let f = |name| LimitField { at, name };
        check_key(f("key"), &self.key)?;
        if let Some(w) = self.window {
            check_range(f("calls"), w.calls, 1, MAX_CALLS)?;
            check_range(f("perMs"), w.per_ms, 1, MAX_PER_MS)?;
        }
        if let Some(b) = self.bucket {
            if self.window.is_some() {
                return Err(calls_with_refill(at));
            }
            check_range(f("refill"), b.refill, 1, MAX_CALLS)?;
            check_range(f("perMs"), b.per_ms, 1, MAX_PER_MS)?;
            check_range(f("burst"), b.burst, 1, MAX_CALLS)?;
            check_range(f("initial"), b.initial, 0, b.burst)?;
        }
        if let Some(c) = self.concurrent {
            check_range(f("concurrent"), c, 1, MAX_CONCURRENT)?;
        }
        if let Some(adapt) = self.adapt {
            let calls = self.nominal_calls().ok_or_else(|| adapt_needs_window(at))?;
            adapt.validate(at, calls)?;
        }
        if self.window.is_none() && self.bucket.is_none() && self.concurrent.is_none() {
            return Err(BadRequest::field(
                f(""),
                "must have a window (calls and perMs) or a bucket (refill and perMs), a concurrent, or both",
            ));
        }
        check_range(f("cost"), self.cost, 0, MAX_COST)?;
        check_range(f("holdMs"), self.hold_ms, 1, MAX_HOLD_MS)?;
        Ok(())
    }
}

impl AcquireRequest {
    /// Builds a request and checks every bound (`holdMs` the default, no report, no permit
    /// unless a limit has `concurrent`).
    pub fn new(key: impl Into<String>, limits: Vec<Limit>) -> Result<Self, BadRequest> {
        let req = AcquireRequest {
            key: key.into(),
            limits,
            hold_ms: DEFAULT_HOLD_MS,
            report: false,
            permit: false,
            queue: false,
            ticket: None,
            grace_ms: DEFAULT_GRACE_MS,
            max_wait_ms: None,
            id: None,
        };
        req.validate()?;
        Ok(req)
    }

    /// Names this ask (section 16), so a retry after a lost answer counts once and
    /// `release {id}` can undo it.
    pub fn with_id(mut self, id: impl Into<String>) -> Result<Self, BadRequest> {
        self.id = Some(id.into());
        self.validate()?;
        Ok(self)
    }

    /// Files a ticket when refused for `rate` or `concurrency` (section 12.1).
    #[must_use]
    pub fn with_queue(mut self) -> Self {
        self.queue = true;
        self
    }

    /// Asks again with the ticket a refusal named (section 12.3).
    pub fn with_ticket(mut self, ticket: impl Into<String>) -> Result<Self, BadRequest> {
        self.ticket = Some(ticket.into());
        self.validate()?;
        Ok(self)
    }

    /// Sets how long a ticket waits past its `retryAt` before it lapses (section 12.4).
    pub fn with_grace_ms(mut self, grace_ms: u64) -> Result<Self, BadRequest> {
        self.grace_ms = grace_ms;
        self.validate()?;
        Ok(self)
    }

    /// Sets how long this host is willing to wait (section 12.9).
    pub fn with_max_wait_ms(mut self, max_wait_ms: u64) -> Result<Self, BadRequest> {
        self.max_wait_ms = Some(max_wait_ms);
        self.validate()?;
        Ok(self)
    }

    /// Whether the request takes part in the line: it queues, or asks with a ticket.
    #[must_use]
    pub fn in_line(&self) -> bool {
        self.queue || self.ticket.is_some()
    }

    /// Asks for a permit even without concurrency places (section 9.3).
    #[must_use]
    pub fn with_permit(mut self) -> Self {
        self.permit = true;
        self
    }

    /// Asks for the figures of each limit with the answer (section 9.2).
    #[must_use]
    pub fn with_report(mut self) -> Self {
        self.report = true;
        self
    }

    /// Sets the request's own `holdMs` (a place-less permit's life); limits keep theirs.
    pub fn with_hold_ms(mut self, hold_ms: u64) -> Result<Self, BadRequest> {
        self.hold_ms = hold_ms;
        self.validate()?;
        Ok(self)
    }

    /// Whether a grant of this request gets a permit.
    #[must_use]
    pub fn wants_permit(&self) -> bool {
        self.permit || self.limits.iter().any(|l| l.concurrent.is_some())
    }

    /// Checks every bound of the spec's acquire table.
    pub fn validate(&self) -> Result<(), BadRequest> {
        check_key("key", &self.key)?;
        check_range("holdMs", self.hold_ms, 1, MAX_HOLD_MS)?;
        check_range("graceMs", self.grace_ms, MIN_GRACE_MS, MAX_GRACE_MS)?;
        if let Some(max_wait_ms) = self.max_wait_ms {
            check_range("maxWaitMs", max_wait_ms, 1, MAX_WAIT_MS)?;
        }
        if let Some(ticket) = &self.ticket {
            check_ticket(ticket)?;
        }
        if let Some(id) = &self.id {
            check_id(id)?;
        }
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
            if lim.contains_key("calls") && lim.contains_key("refill") {
                return Err(calls_with_refill(i));
            }
            let calls = optional_int(lim, "calls", f("calls"), 1, MAX_CALLS)?;
            let per_ms = optional_int(lim, "perMs", f("perMs"), 1, MAX_PER_MS)?;
            let bucket = parse_bucket(lim, i, per_ms)?;
            let window = match (calls, per_ms) {
                (Some(calls), Some(per_ms)) => Some(WindowLimit { calls, per_ms }),
                (None, None) => None,
                (None, Some(_)) if bucket.is_some() => None,
                (Some(_), None) => return Err(BadRequest::field(f("perMs"), "is required with calls")),
                (None, Some(_)) => return Err(BadRequest::field(f("calls"), "is required with perMs")),
            };
            let calls = window.map(|w| w.calls).or(bucket.map(|b| b.refill));
            limits.push(Limit {
                key: key.to_owned(),
                window,
                bucket,
                concurrent: optional_int(lim, "concurrent", f("concurrent"), 1, MAX_CONCURRENT)?,
                cost: optional_int(lim, "cost", f("cost"), 0, MAX_COST)?.unwrap_or(cost),
                hold_ms: optional_int(lim, "holdMs", f("holdMs"), 1, MAX_HOLD_MS)?.unwrap_or(hold_ms),
                adapt: parse_adapt(lim, i, calls)?,
            });
        }
        let report = optional_bool(obj, "report")?;
        let permit = optional_bool(obj, "permit")?;
        let queue = optional_bool(obj, "queue")?;
        let ticket = match obj.get("ticket") {
            None => None,
            Some(Value::String(t)) => Some(t.clone()),
            Some(_) => return Err(ticket_error()),
        };
        let grace_ms = optional_int(obj, "graceMs", "graceMs", MIN_GRACE_MS, MAX_GRACE_MS)?.unwrap_or(DEFAULT_GRACE_MS);
        let max_wait_ms = optional_int(obj, "maxWaitMs", "maxWaitMs", 1, MAX_WAIT_MS)?;
        let id = match obj.get("id") {
            None => None,
            Some(Value::String(id)) => Some(id.clone()),
            Some(_) => return Err(id_error()),
        };
        let req = AcquireRequest {
            key: key.to_owned(),
            limits,
            hold_ms,
            report,
            permit,
            queue,
            ticket,
            grace_ms,
            max_wait_ms,
            id,
        };
        req.validate()?;
        Ok(req)
    }
}

/// `calls` and `refill` in one limit: a limit is a window or a bucket, never both.
fn calls_with_refill(at: usize) -> BadRequest {
    BadRequest(format!(
        "limits[{at}].calls and limits[{at}].refill never go together: a limit is a window (calls) or a bucket (refill)"
    ))
}

/// `adapt` on a limit with neither a window nor a bucket.
fn adapt_needs_window(at: usize) -> BadRequest {
    BadRequest::field(LimitField { at, name: "adapt" }, "needs a window (calls) or a bucket (refill) to adapt")
}

/// The adaptive ceiling of `limits[at]` (section 14), when it names `adapt`, its defaults
/// resolved from the limit's `calls` (a bucket's `refill`).
fn parse_adapt(lim: &Map<String, Value>, at: usize, calls: Option<u64>) -> Result<Option<Adapt>, BadRequest> {
    let f = |name| LimitField { at, name };
    let Some(raw) = lim.get("adapt") else { return Ok(None) };
    let obj = object(raw, f("adapt"))?;
    let calls = calls.ok_or_else(|| adapt_needs_window(at))?;
    let defaults = Adapt::defaults(calls);
    let adapt = Adapt {
        min: optional_int(obj, "min", f("adapt.min"), 1, calls)?.unwrap_or(defaults.min),
        max: optional_int(obj, "max", f("adapt.max"), calls, MAX_CALLS)?.unwrap_or(defaults.max),
        increase: optional_int(obj, "increase", f("adapt.increase"), 0, MAX_INCREASE)?.unwrap_or(defaults.increase),
        keep_pct: optional_int(obj, "keepPct", f("adapt.keepPct"), 1, 99)?.unwrap_or(defaults.keep_pct),
    };
    adapt.validate(at, calls)?;
    Ok(Some(adapt))
}

/// The token bucket of `limits[at]` (section 13), when it names `refill`: `burst` defaults to
/// `refill`, `initial` to `burst`; `burst` or `initial` without `refill` is an error naming it.
fn parse_bucket(lim: &Map<String, Value>, at: usize, per_ms: Option<u64>) -> Result<Option<BucketLimit>, BadRequest> {
    let f = |name| LimitField { at, name };
    let Some(refill) = optional_int(lim, "refill", f("refill"), 1, MAX_CALLS)? else {
        for name in ["burst", "initial"] {
            if lim.contains_key(name) {
                return Err(BadRequest::field(f(name), "needs refill (a token bucket)"));
            }
        }
        return Ok(None);
    };
    let per_ms = per_ms.ok_or_else(|| BadRequest::field(f("perMs"), "is required with refill"))?;
    let burst = optional_int(lim, "burst", f("burst"), 1, MAX_CALLS)?.unwrap_or(refill);
    let initial = match optional_int(lim, "initial", f("initial"), 0, MAX_CALLS)? {
        Some(initial) if initial > burst => {
            return Err(BadRequest::field(f("initial"), format_args!("must be an integer from 0 to burst ({burst})")));
        }
        Some(initial) => initial,
        None => burst,
    };
    Ok(Some(BucketLimit { refill, per_ms, burst, initial }))
}

fn id_error() -> BadRequest {
    BadRequest::field("id", format_args!("must be a string of 1 to {MAX_ID_BYTES} bytes"))
}

fn check_id(id: &str) -> Result<(), BadRequest> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(id_error());
    }
    Ok(())
}

impl UndoRequest {
    pub fn new(id: impl Into<String>) -> Result<Self, BadRequest> {
        let id = id.into();
        check_id(&id)?;
        Ok(UndoRequest { id, costs: Vec::new() })
    }

    /// An undo that settles the grant's windows to `costs` (0: never made) first; no costs is
    /// the plain undo.
    pub fn with_costs(id: impl Into<String>, costs: Vec<Cost>) -> Result<Self, BadRequest> {
        let id = id.into();
        check_id(&id)?;
        if !costs.is_empty() {
            check_costs(&costs)?;
        }
        Ok(UndoRequest { id, costs })
    }

    /// Parses a `release` naming an `id`: neither `permit` nor `ticket` beside it.
    pub fn from_json(params: &Value) -> Result<Self, BadRequest> {
        let obj = object(params, "params")?;
        if obj.contains_key("permit") || obj.contains_key("ticket") {
            return Err(BadRequest::field("id", "must not be given with permit or ticket: release one of them"));
        }
        let id = match obj.get("id") {
            Some(Value::String(id)) => id,
            _ => return Err(id_error()),
        };
        check_id(id)?;
        let costs = match obj.get("costs") {
            None => Vec::new(),
            Some(raw) => parse_costs(raw)?,
        };
        Ok(UndoRequest { id: id.clone(), costs })
    }

    /// The request in the wire's JSON form.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let mut body = serde_json::json!({ "id": self.id });
        if !self.costs.is_empty() {
            body["costs"] = Value::from(self.costs.iter().map(Cost::to_json).collect::<Vec<_>>());
        }
        body
    }
}

fn ticket_error() -> BadRequest {
    BadRequest::field("ticket", format_args!("must be a string of 1 to {MAX_TICKET_BYTES} bytes"))
}

fn check_ticket(ticket: &str) -> Result<(), BadRequest> {
    if ticket.is_empty() || ticket.len() > MAX_TICKET_BYTES {
        return Err(ticket_error());
    }
    Ok(())
}

impl LeaveRequest {
    pub fn new(ticket: impl Into<String>) -> Result<Self, BadRequest> {
        let ticket = ticket.into();
        check_ticket(&ticket)?;
        Ok(LeaveRequest { ticket })
    }

    /// Parses a `release` naming a `ticket`: exactly one of `permit` and `ticket`, and `costs`
    /// only with a permit.
    pub fn from_json(params: &Value) -> Result<Self, BadRequest> {
        let obj = object(params, "params")?;
        if obj.contains_key("permit") {
            return Err(BadRequest::field("ticket", "must not be given with permit: release one or the other"));
        }
        if obj.contains_key("costs") {
            return Err(BadRequest::field("costs", "goes with a permit only, not a ticket"));
        }
        match obj.get("ticket") {
            Some(Value::String(t)) => LeaveRequest::new(t.clone()),
            Some(_) => Err(ticket_error()),
            None => Err(BadRequest::field("ticket", "is required")),
        }
    }

    /// The request in the wire's JSON form.
    #[must_use]
    pub fn to_json(&self) -> Value {
        serde_json::json!({ "ticket": self.ticket })
    }
}

fn check_permit(permit: &str) -> Result<(), BadRequest> {
    if permit.is_empty() || permit.len() > MAX_PERMIT_BYTES {
        return Err(BadRequest::field("permit", format_args!("must be a string of 1 to {MAX_PERMIT_BYTES} bytes")));
    }
    Ok(())
}

fn check_costs(costs: &[Cost]) -> Result<(), BadRequest> {
    if costs.is_empty() || costs.len() > MAX_LIMITS {
        return Err(BadRequest::field("costs", format_args!("must have 1 to {MAX_LIMITS} entries")));
    }
    for (i, c) in costs.iter().enumerate() {
        check_key(format_args!("costs[{i}].key"), &c.key)?;
        check_range(format_args!("costs[{i}].cost"), c.cost, 0, MAX_COST)?;
        if costs[..i].iter().any(|o| o.key == c.key) {
            return Err(BadRequest::field(format_args!("costs[{i}].key"), "must be unique within the request"));
        }
    }
    Ok(())
}

/// The `costs` array of a settle or release, parsed and checked.
fn parse_costs(raw: &Value) -> Result<Vec<Cost>, BadRequest> {
    let Value::Array(items) = raw else { return Err(BadRequest::field("costs", "must be an array")) };
    if items.is_empty() || items.len() > MAX_LIMITS {
        return Err(BadRequest::field("costs", format_args!("must have 1 to {MAX_LIMITS} entries")));
    }
    let mut costs = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let obj = object(item, format_args!("costs[{i}]"))?;
        let key = required_str(obj, "key", format_args!("costs[{i}].key"))?;
        let cost = optional_int(obj, "cost", format_args!("costs[{i}].cost"), 0, MAX_COST)?
            .ok_or_else(|| BadRequest::field(format_args!("costs[{i}].cost"), "is required"))?;
        costs.push(Cost { key: key.to_owned(), cost });
    }
    check_costs(&costs)?;
    Ok(costs)
}

impl Cost {
    #[must_use]
    pub fn new(key: impl Into<String>, cost: u64) -> Self {
        Cost { key: key.into(), cost }
    }
}

impl ReleaseRequest {
    pub fn new(permit: impl Into<String>) -> Result<Self, BadRequest> {
        let permit = permit.into();
        check_permit(&permit)?;
        Ok(ReleaseRequest { permit, costs: Vec::new(), outcome: None })
    }

    /// A release that settles `costs` first, in one durable step.
    pub fn with_costs(permit: impl Into<String>, costs: Vec<Cost>) -> Result<Self, BadRequest> {
        let permit = permit.into();
        check_permit(&permit)?;
        check_costs(&costs)?;
        Ok(ReleaseRequest { permit, costs, outcome: None })
    }

    /// Reports what became of the call (section 14).
    #[must_use]
    pub fn with_outcome(mut self, outcome: Signal) -> Self {
        self.outcome = Some(outcome);
        self
    }

    pub fn from_json(params: &Value) -> Result<Self, BadRequest> {
        let obj = object(params, "params")?;
        let permit = required_str(obj, "permit", "permit")?;
        check_permit(permit)?;
        let costs = match obj.get("costs") {
            None => Vec::new(),
            Some(raw) => parse_costs(raw)?,
        };
        Ok(ReleaseRequest { permit: permit.to_owned(), costs, outcome: parse_outcome(obj)? })
    }
}

impl SettleRequest {
    pub fn new(permit: impl Into<String>, costs: Vec<Cost>) -> Result<Self, BadRequest> {
        let permit = permit.into();
        check_permit(&permit)?;
        check_costs(&costs)?;
        Ok(SettleRequest { permit, costs, outcome: None })
    }

    /// Reports what became of the call (section 14).
    #[must_use]
    pub fn with_outcome(mut self, outcome: Signal) -> Self {
        self.outcome = Some(outcome);
        self
    }

    pub fn from_json(params: &Value) -> Result<Self, BadRequest> {
        let obj = object(params, "params")?;
        let permit = required_str(obj, "permit", "permit")?;
        check_permit(permit)?;
        let costs = parse_costs(obj.get("costs").ok_or_else(|| BadRequest::field("costs", "is required"))?)?;
        Ok(SettleRequest { permit: permit.to_owned(), costs, outcome: parse_outcome(obj)? })
    }
}

impl LiftRequest {
    pub fn new(key: impl Into<String>) -> Result<Self, BadRequest> {
        let key = key.into();
        check_key("key", &key)?;
        Ok(LiftRequest { key })
    }

    pub fn from_json(params: &Value) -> Result<Self, BadRequest> {
        let obj = object(params, "params")?;
        LiftRequest::new(required_str(obj, "key", "key")?)
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
        Ok(ThrottleRequest { key, until, permit: None })
    }

    /// Names the permit whose call the provider limited (section 14): its adapted buckets are
    /// cut as by a `limited` outcome.
    pub fn with_permit(mut self, permit: impl Into<String>) -> Result<Self, BadRequest> {
        let permit = permit.into();
        check_permit(&permit)?;
        self.permit = Some(permit);
        Ok(self)
    }

    pub fn from_json(params: &Value, now: Millis) -> Result<Self, BadRequest> {
        let obj = object(params, "params")?;
        let key = required_str(obj, "key", "key")?;
        let until = match obj.get("until") {
            Some(Value::String(s)) => parse_instant(s).map_err(|e| BadRequest::field("until", e))?,
            Some(_) => return Err(BadRequest::field("until", "must be an instant string")),
            None => return Err(BadRequest::field("until", "is required")),
        };
        let req = ThrottleRequest::new(key, until, now)?;
        match obj.get("permit") {
            None => Ok(req),
            Some(Value::String(p)) => req.with_permit(p.clone()),
            Some(_) => {
                Err(BadRequest::field("permit", format_args!("must be a string of 1 to {MAX_PERMIT_BYTES} bytes")))
            }
        }
    }

    /// The request in the wire's JSON form.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let mut body = serde_json::json!({ "key": self.key, "until": crate::time::format_instant(self.until) });
        if let Some(permit) = &self.permit {
            body["permit"] = Value::from(permit.clone());
        }
        body
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

/// An optional JSON boolean (`false` when absent); anything else is an error naming it.
fn optional_bool(obj: &Map<String, Value>, name: &str) -> Result<bool, BadRequest> {
    match obj.get(name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(BadRequest::field(name, "must be true or false")),
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
    fn a_bucket_limit_parses_with_its_defaults_and_every_error_names_its_fields() {
        let req = AcquireRequest::from_json(&json!({
            "key": "k", "cost": 3,
            "limits": [
                { "key": "a", "refill": 10, "perMs": 1000 },
                { "key": "b", "refill": 10, "perMs": 1000, "burst": 40, "concurrent": 2 },
                { "key": "c", "refill": 1, "perMs": 60000, "burst": 5, "initial": 0, "cost": 9 }
            ]
        }))
        .unwrap();
        let b = |l: &Limit| l.bucket.map(|b| (b.refill, b.per_ms, b.burst, b.initial));
        assert_eq!(b(&req.limits[0]), Some((10, 1000, 10, 10)), "burst defaults to refill, initial to burst");
        assert_eq!(b(&req.limits[1]), Some((10, 1000, 40, 40)));
        assert_eq!(req.limits[1].concurrent, Some(2));
        assert_eq!((b(&req.limits[2]), req.limits[2].cost), (Some((1, 60000, 5, 0)), 9));
        assert_eq!(req.limits[0].window, None);
        assert_eq!((req.limits[0].counted_cost(), req.limits[2].counted_cost()), (3, 5), "capped at burst");
        let one = |limit: Value| err(json!({"key": "k", "limits": [{"key": "z", "calls": 1, "perMs": 1}, limit]}));
        assert_eq!(
            one(json!({"key": "a", "calls": 5, "refill": 5, "perMs": 1000})),
            "limits[1].calls and limits[1].refill never go together: a limit is a window (calls) or a bucket (refill)"
        );
        assert_eq!(one(json!({"key": "a", "refill": 5})), "limits[1].perMs is required with refill");
        assert_eq!(
            one(json!({"key": "a", "refill": 0, "perMs": 1000})),
            "limits[1].refill must be an integer from 1 to 1000000000"
        );
        assert_eq!(
            one(json!({"key": "a", "refill": 1.5, "perMs": 1000})),
            "limits[1].refill must be an integer from 1 to 1000000000"
        );
        assert_eq!(
            one(json!({"key": "a", "refill": 1, "perMs": 1000, "burst": 0})),
            "limits[1].burst must be an integer from 1 to 1000000000"
        );
        assert_eq!(
            one(json!({"key": "a", "refill": 1, "perMs": 1000, "burst": 5, "initial": 6})),
            "limits[1].initial must be an integer from 0 to burst (5)"
        );
        assert_eq!(
            one(json!({"key": "a", "refill": 7, "perMs": 1000, "initial": 8})),
            "limits[1].initial must be an integer from 0 to burst (7)"
        );
        assert_eq!(
            one(json!({"key": "a", "burst": 5, "concurrent": 1})),
            "limits[1].burst needs refill (a token bucket)"
        );
        assert_eq!(
            one(json!({"key": "a", "calls": 5, "perMs": 9, "initial": 1})),
            "limits[1].initial needs refill (a token bucket)"
        );
        assert_eq!(
            one(json!({"key": "a", "refill": 1, "perMs": 2678400001u64})),
            "limits[1].perMs must be an integer from 1 to 2678400000"
        );
        // Built in code, the same bounds hold.
        let built = |limit: Limit| AcquireRequest::new("k", vec![limit]).unwrap_err().0;
        assert_eq!(
            built(Limit::bucket("a", 5, 10).with_burst(4).with_initial(5)),
            "limits[0].initial must be an integer from 0 to 4"
        );
        let mut both = Limit::bucket("a", 5, 10);
        both.window = Some(WindowLimit { calls: 1, per_ms: 1 });
        assert!(built(both).contains("never go together"));
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
            "limits[0] must have a window (calls and perMs) or a bucket (refill and perMs), a concurrent, or both"
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

/// The methods of the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Acquire,
    Release,
    Throttle,
    Peek,
    Settle,
    Lift,
    /// Section 15.
    Wait,
}

impl Method {
    /// The method named on the wire (`acquire`, `release`, `throttle`, `peek`, `settle`, `lift`).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Method> {
        match name {
            "acquire" => Some(Method::Acquire),
            "release" => Some(Method::Release),
            "throttle" => Some(Method::Throttle),
            "peek" => Some(Method::Peek),
            "settle" => Some(Method::Settle),
            "lift" => Some(Method::Lift),
            "wait" => Some(Method::Wait),
            _ => None,
        }
    }

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Method::Acquire => "acquire",
            Method::Release => "release",
            Method::Throttle => "throttle",
            Method::Peek => "peek",
            Method::Settle => "settle",
            Method::Lift => "lift",
            Method::Wait => "wait",
        }
    }
}

/// Any one validated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Acquire(AcquireRequest),
    Release(ReleaseRequest),
    /// A `release` naming a `ticket` rather than a permit (section 12.4).
    Leave(LeaveRequest),
    /// A `release` naming a request `id` (section 16).
    Undo(UndoRequest),
    Throttle(ThrottleRequest),
    /// A `peek` takes exactly an acquire's params.
    Peek(AcquireRequest),
    Settle(SettleRequest),
    Lift(LiftRequest),
    /// Section 15.
    Wait(WaitRequest),
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
            Method::Release if params.get("id").is_some() => Request::Undo(UndoRequest::from_json(params)?),
            Method::Release if params.get("ticket").is_some() => Request::Leave(LeaveRequest::from_json(params)?),
            Method::Release => Request::Release(ReleaseRequest::from_json(params)?),
            Method::Throttle => Request::Throttle(ThrottleRequest::from_json(params, now)?),
            Method::Peek => Request::Peek(AcquireRequest::from_json(params)?),
            Method::Settle => Request::Settle(SettleRequest::from_json(params)?),
            Method::Lift => Request::Lift(LiftRequest::from_json(params)?),
            Method::Wait => Request::Wait(WaitRequest::from_json(params)?),
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
            Ok(Request::Release(ReleaseRequest { permit: "p".into(), costs: Vec::new(), outcome: None }))
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
                if let Some(b) = l.bucket {
                    m.insert("refill".into(), Value::from(b.refill));
                    m.insert("perMs".into(), Value::from(b.per_ms));
                    m.insert("burst".into(), Value::from(b.burst));
                    m.insert("initial".into(), Value::from(b.initial));
                }
                if let Some(c) = l.concurrent {
                    m.insert("concurrent".into(), Value::from(c));
                }
                m.insert("cost".into(), Value::from(l.cost));
                m.insert("holdMs".into(), Value::from(l.hold_ms));
                if let Some(adapt) = l.adapt {
                    m.insert("adapt".into(), adapt.to_json());
                }
                Value::Object(m)
            })
            .collect();
        let mut body = serde_json::json!({ "key": self.key, "holdMs": self.hold_ms, "limits": limits });
        if self.report {
            body["report"] = Value::Bool(true);
        }
        if self.permit {
            body["permit"] = Value::Bool(true);
        }
        if self.queue {
            body["queue"] = Value::Bool(true);
        }
        if let Some(ticket) = &self.ticket {
            body["ticket"] = Value::from(ticket.clone());
        }
        if self.grace_ms != DEFAULT_GRACE_MS {
            body["graceMs"] = Value::from(self.grace_ms);
        }
        if let Some(max_wait_ms) = self.max_wait_ms {
            body["maxWaitMs"] = Value::from(max_wait_ms);
        }
        if let Some(id) = &self.id {
            body["id"] = Value::from(id.clone());
        }
        body
    }
}

impl Cost {
    fn to_json(&self) -> Value {
        serde_json::json!({ "key": self.key, "cost": self.cost })
    }
}

impl ReleaseRequest {
    /// The request in the wire's JSON form.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let mut body = serde_json::json!({ "permit": self.permit });
        if !self.costs.is_empty() {
            body["costs"] = Value::Array(self.costs.iter().map(Cost::to_json).collect());
        }
        if let Some(outcome) = self.outcome {
            body["outcome"] = Value::from(outcome.as_str());
        }
        body
    }
}

impl SettleRequest {
    /// The request in the wire's JSON form.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let mut body = serde_json::json!({
            "permit": self.permit,
            "costs": self.costs.iter().map(Cost::to_json).collect::<Vec<_>>(),
        });
        if let Some(outcome) = self.outcome {
            body["outcome"] = Value::from(outcome.as_str());
        }
        body
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
                Limit::bucket("tb", 3, 1000).with_burst(7).with_initial(2).with_concurrent(1),
            ],
        )
        .unwrap();
        assert_eq!(AcquireRequest::from_json(&req.to_json()), Ok(req.clone()));
        let req = req.with_permit().with_report().with_hold_ms(5).unwrap();
        assert_eq!(AcquireRequest::from_json(&req.to_json()), Ok(req));
        let settle = SettleRequest::new("p-1", vec![Cost::new("w", 7), Cost::new("both", 0)]).unwrap();
        assert_eq!(SettleRequest::from_json(&settle.to_json()), Ok(settle));
        let release = ReleaseRequest::with_costs("p-1", vec![Cost::new("w", 7)]).unwrap();
        assert_eq!(ReleaseRequest::from_json(&release.to_json()), Ok(release));
        let plain = ReleaseRequest::new("p-1").unwrap();
        assert_eq!(ReleaseRequest::from_json(&plain.to_json()), Ok(plain));
    }

    /// Section 14: `adapt` on a window or a bucket, its defaults and bounds named field by field;
    /// `outcome` on release and settle, `permit` on throttle; each round trip through `to_json`.
    #[test]
    fn adapt_outcome_and_a_throttle_permit_parse_name_their_bad_fields_and_round_trip() {
        let now = Millis(1_800_000_000_000);
        let one = |limit: Value| AcquireRequest::from_json(&serde_json::json!({"key": "k", "limits": [limit]}));
        let err = |limit: Value| one(limit).unwrap_err().0;
        let req = one(serde_json::json!({"key": "w", "calls": 25, "perMs": 1000, "adapt": {}})).unwrap();
        assert_eq!(req.limits[0].adapt, Some(Adapt { min: 2, max: 25, increase: 1, keep_pct: 50 }));
        let req = one(serde_json::json!({"key": "w", "calls": 5, "perMs": 1000, "adapt": {}})).unwrap();
        assert_eq!(req.limits[0].adapt.map(|a| a.min), Some(1), "at least 1");
        let full = serde_json::json!({"key": "b", "refill": 10, "perMs": 1000, "burst": 40,
            "adapt": {"min": 3, "max": 100, "increase": 0, "keepPct": 99}});
        let req = one(full).unwrap();
        assert_eq!(req.limits[0].adapt, Some(Adapt { min: 3, max: 100, increase: 0, keep_pct: 99 }));
        assert_eq!(AcquireRequest::from_json(&req.to_json()), Ok(req.clone()), "round trip");
        let w = |adapt: Value| serde_json::json!({"key": "w", "calls": 10, "perMs": 1000, "adapt": adapt});
        assert_eq!(
            err(w(serde_json::json!({"keepPct": 100}))),
            "limits[0].adapt.keepPct must be an integer from 1 to 99"
        );
        assert_eq!(
            err(w(serde_json::json!({"keepPct": 0}))),
            "limits[0].adapt.keepPct must be an integer from 1 to 99"
        );
        assert_eq!(err(w(serde_json::json!({"min": 0}))), "limits[0].adapt.min must be an integer from 1 to 10");
        assert_eq!(err(w(serde_json::json!({"min": 11}))), "limits[0].adapt.min must be an integer from 1 to 10");
        assert_eq!(
            err(w(serde_json::json!({"max": 9}))),
            "limits[0].adapt.max must be an integer from 10 to 1000000000"
        );
        assert_eq!(
            err(w(serde_json::json!({"increase": 1_000_001}))),
            "limits[0].adapt.increase must be an integer from 0 to 1000000"
        );
        assert_eq!(err(w(serde_json::json!({"min": 1.5}))), "limits[0].adapt.min must be an integer from 1 to 10");
        assert_eq!(err(w(serde_json::json!(5))), "limits[0].adapt must be a JSON object");
        assert_eq!(
            err(serde_json::json!({"key": "c", "concurrent": 2, "adapt": {}})),
            "limits[0].adapt needs a window (calls) or a bucket (refill) to adapt"
        );
        assert_eq!(
            AcquireRequest::new("k", vec![Limit::concurrent("c", 1).with_adapt(Adapt::defaults(1))]).unwrap_err().0,
            "limits[0].adapt needs a window (calls) or a bucket (refill) to adapt"
        );
        // Outcomes.
        let release = |v: Value| ReleaseRequest::from_json(&v);
        let clean = release(serde_json::json!({"permit": "p-1", "outcome": "clean"})).unwrap();
        assert_eq!(clean.outcome, Some(Signal::Clean));
        assert_eq!(ReleaseRequest::from_json(&clean.to_json()), Ok(clean));
        assert_eq!(
            release(serde_json::json!({"permit": "p-1", "outcome": "ok"})).unwrap_err().0,
            "outcome must be \"clean\" or \"limited\""
        );
        let settle = SettleRequest::new("p-1", vec![Cost::new("w", 3)]).unwrap().with_outcome(Signal::Limited);
        assert_eq!(SettleRequest::from_json(&settle.to_json()), Ok(settle));
        assert_eq!(
            SettleRequest::from_json(
                &serde_json::json!({"permit": "p", "costs": [{"key": "a", "cost": 1}], "outcome": 1})
            )
            .unwrap_err()
            .0,
            "outcome must be \"clean\" or \"limited\""
        );
        // A throttle naming the permit whose call was limited.
        let throttle = ThrottleRequest::new("k", now.plus(5_000), now).unwrap().with_permit("p-1").unwrap();
        assert_eq!(ThrottleRequest::from_json(&throttle.to_json(), now), Ok(throttle));
        let bad = serde_json::json!({"key": "k", "until": crate::time::format_instant(now), "permit": ""});
        assert_eq!(ThrottleRequest::from_json(&bad, now).unwrap_err().0, "permit must be a string of 1 to 128 bytes");
    }

    /// Section 12.8: `queue`, `ticket` and `graceMs` are checked and named, on acquire and
    /// peek alike; a `release` names exactly one of `permit` and `ticket`.
    #[test]
    fn line_fields_name_their_bad_fields() {
        let now = Millis(1_800_000_000_000);
        let base = || serde_json::json!({"key": "k", "limits": [{"key": "b", "calls": 1, "perMs": 1000}]});
        let with = |field: &str, v: Value| {
            let mut body = base();
            body[field] = v;
            body
        };
        for method in [Method::Acquire, Method::Peek] {
            let err = |v: Value| Request::from_params(method, &v, now).unwrap_err().0;
            assert_eq!(err(with("queue", serde_json::json!(1))), "queue must be true or false");
            assert_eq!(err(with("queue", serde_json::json!("true"))), "queue must be true or false");
            assert_eq!(err(with("ticket", serde_json::json!(""))), "ticket must be a string of 1 to 128 bytes");
            assert_eq!(
                err(with("ticket", serde_json::json!("t".repeat(129)))),
                "ticket must be a string of 1 to 128 bytes"
            );
            assert_eq!(err(with("ticket", serde_json::json!(7))), "ticket must be a string of 1 to 128 bytes");
            assert_eq!(err(with("ticket", Value::Null)), "ticket must be a string of 1 to 128 bytes");
            assert_eq!(err(with("graceMs", serde_json::json!(99))), "graceMs must be an integer from 100 to 60000");
            assert_eq!(err(with("graceMs", serde_json::json!(60_001))), "graceMs must be an integer from 100 to 60000");
            assert_eq!(err(with("graceMs", serde_json::json!(500.0))), "graceMs must be an integer from 100 to 60000");
            for bad in
                [serde_json::json!(0), serde_json::json!(86_400_001), serde_json::json!("5"), serde_json::json!(1.5)]
            {
                assert_eq!(err(with("maxWaitMs", bad)), "maxWaitMs must be an integer from 1 to 86400000");
            }
        }
        let req = AcquireRequest::from_json(&with("maxWaitMs", serde_json::json!(86_400_000))).unwrap();
        assert_eq!(req.max_wait_ms, Some(86_400_000));
        assert_eq!(AcquireRequest::from_json(&req.to_json()), Ok(req));
        let req = AcquireRequest::from_json(&base()).unwrap();
        assert_eq!((req.queue, req.ticket.as_deref(), req.grace_ms), (false, None, DEFAULT_GRACE_MS));
        assert!(!req.in_line());
        let mut body = with("queue", Value::Bool(true));
        body["ticket"] = Value::from("t-1".to_owned() + &"x".repeat(125));
        body["graceMs"] = Value::from(60_000);
        let req = AcquireRequest::from_json(&body).unwrap();
        assert_eq!((req.queue, req.ticket.as_deref().map(str::len), req.grace_ms), (true, Some(128), 60_000));
        assert_eq!(AcquireRequest::from_json(&req.to_json()), Ok(req.clone()), "round trip");
        // A request that never queues writes none of the new fields.
        let plain = AcquireRequest::from_json(&base()).unwrap().to_json();
        assert!(plain.get("queue").is_none() && plain.get("ticket").is_none() && plain.get("graceMs").is_none());
        let release = |v: Value| Request::from_params(Method::Release, &v, now);
        assert_eq!(
            release(serde_json::json!({"ticket": "t-1"})),
            Ok(Request::Leave(LeaveRequest { ticket: "t-1".into() }))
        );
        assert_eq!(
            release(serde_json::json!({"ticket": "t-1", "permit": "p-1"})).unwrap_err().0,
            "ticket must not be given with permit: release one or the other"
        );
        assert_eq!(
            release(serde_json::json!({"ticket": "t-1", "costs": [{"key": "a", "cost": 1}]})).unwrap_err().0,
            "costs goes with a permit only, not a ticket"
        );
        assert_eq!(
            release(serde_json::json!({"ticket": ""})).unwrap_err().0,
            "ticket must be a string of 1 to 128 bytes"
        );
        assert_eq!(
            release(serde_json::json!({"ticket": null})).unwrap_err().0,
            "ticket must be a string of 1 to 128 bytes"
        );
        assert_eq!(release(serde_json::json!({})).unwrap_err().0, "permit is required");
        let leave = LeaveRequest::new("t-9").unwrap();
        assert_eq!(LeaveRequest::from_json(&leave.to_json()), Ok(leave));
        assert!(LeaveRequest::new("").is_err());
        assert_eq!(
            AcquireRequest::new("k", vec![]).unwrap().with_grace_ms(50).unwrap_err().0,
            "graceMs must be an integer from 100 to 60000"
        );
        assert_eq!(
            AcquireRequest::new("k", vec![]).unwrap().with_ticket("").unwrap_err().0,
            "ticket must be a string of 1 to 128 bytes"
        );
    }

    /// Section 9.5: every bad field of the new bodies is named; booleans are strict.
    #[test]
    fn settle_lift_and_options_name_their_bad_fields() {
        let acquire = |v: Value| AcquireRequest::from_json(&v).unwrap_err().0;
        assert_eq!(acquire(serde_json::json!({"key": "k", "limits": [], "report": 1})), "report must be true or false");
        assert_eq!(
            acquire(serde_json::json!({"key": "k", "limits": [], "permit": "true"})),
            "permit must be true or false"
        );
        assert!(AcquireRequest::from_json(&serde_json::json!({"key": "k", "limits": [], "permit": false})).is_ok());
        let settle = |v: Value| SettleRequest::from_json(&v).unwrap_err().0;
        assert_eq!(settle(serde_json::json!({"costs": [{"key": "a", "cost": 1}]})), "permit is required");
        assert_eq!(settle(serde_json::json!({"permit": "", "costs": []})), "permit must be a string of 1 to 128 bytes");
        assert_eq!(settle(serde_json::json!({"permit": "p"})), "costs is required");
        assert_eq!(settle(serde_json::json!({"permit": "p", "costs": {}})), "costs must be an array");
        assert_eq!(settle(serde_json::json!({"permit": "p", "costs": []})), "costs must have 1 to 64 entries");
        let many: Vec<Value> = (0..65).map(|i| serde_json::json!({"key": format!("b{i}"), "cost": 1})).collect();
        assert_eq!(settle(serde_json::json!({"permit": "p", "costs": many})), "costs must have 1 to 64 entries");
        assert_eq!(settle(serde_json::json!({"permit": "p", "costs": [5]})), "costs[0] must be a JSON object");
        assert_eq!(settle(serde_json::json!({"permit": "p", "costs": [{"cost": 1}]})), "costs[0].key is required");
        assert_eq!(
            settle(serde_json::json!({"permit": "p", "costs": [{"key": "", "cost": 1}]})),
            "costs[0].key must be a string of 1 to 512 bytes"
        );
        assert_eq!(settle(serde_json::json!({"permit": "p", "costs": [{"key": "a"}]})), "costs[0].cost is required");
        assert_eq!(
            settle(serde_json::json!({"permit": "p", "costs": [{"key": "a", "cost": 1.5}]})),
            "costs[0].cost must be an integer from 0 to 1000000000"
        );
        assert_eq!(
            settle(serde_json::json!({"permit": "p", "costs": [{"key": "a", "cost": 1000000001}]})),
            "costs[0].cost must be an integer from 0 to 1000000000"
        );
        assert_eq!(
            settle(serde_json::json!({"permit": "p", "costs": [{"key": "a", "cost": 1}, {"key": "a", "cost": 2}]})),
            "costs[1].key must be unique within the request"
        );
        assert_eq!(
            ReleaseRequest::from_json(&serde_json::json!({"permit": "p", "costs": []})).unwrap_err().0,
            "costs must have 1 to 64 entries"
        );
        assert_eq!(LiftRequest::from_json(&serde_json::json!({})).unwrap_err().0, "key is required");
        assert_eq!(LiftRequest::from_json(&serde_json::json!({"key": 3})).unwrap_err().0, "key must be a string");
    }
}
