//! The wire's reply bodies, shared by the server (which writes them) and the HTTP client
//! (which reads them). Field names and forms are the spec's: camelCase, instants in
//! `toISOString` form, `permit` only when the grant holds places or was asked for; the figures
//! of section 9 (`now`, `limits`) only on a peek and an acquire that asked for a report; the
//! line's fields of section 12 (`ticket`, `lapseAt`, `ahead`, `queued`) only where a ticket is
//! named or a line waits, so a host on a limiter where nobody queues reads the bodies of before.

use serde::{Deserialize, Serialize};

use crate::engine::{Decision, Figures, Reason, Refusal, StateView, TicketNote, Totals};
use crate::limiter::{Acquired, Peeked, Report};
use crate::time::{Millis, format_instant, parse_instant};

/// An instant as the wire writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instant(pub Millis);

impl Serialize for Instant {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_instant(self.0))
    }
}

impl<'de> Deserialize<'de> for Instant {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        parse_instant(&s).map(Instant).map_err(serde::de::Error::custom)
    }
}

/// The reply to `acquire`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AcquireReply {
    Granted {
        granted: True,
        at: Instant,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        permit: Option<String>,
    },
    Refused {
        granted: False,
        #[serde(rename = "retryAt")]
        retry_at: Instant,
        reason: String,
        limit: String,
        /// The ticket this refusal filed or renewed (section 12.1).
        #[serde(skip_serializing_if = "Option::is_none", default)]
        ticket: Option<String>,
        #[serde(rename = "lapseAt", skip_serializing_if = "Option::is_none", default)]
        lapse_at: Option<Instant>,
        /// The most live tickets ahead of it in any one of its lines.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        ahead: Option<u64>,
        /// The limiter's clock at the decision (with a ticket, or a report).
        #[serde(skip_serializing_if = "Option::is_none", default)]
        now: Option<Instant>,
        /// Why a refusal in the line filed no ticket (section 12.9): `horizon` or `full`.
        #[serde(rename = "noTicket", skip_serializing_if = "Option::is_none", default)]
        no_ticket: Option<String>,
    },
}

/// `true` on the wire, and only `true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct True;
/// `false` on the wire, and only `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct False;

macro_rules! literal_bool {
    ($ty:ident, $value:literal) => {
        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bool($value)
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                if bool::deserialize(d)? == $value {
                    Ok($ty)
                } else {
                    Err(serde::de::Error::custom(concat!("expected ", stringify!($value))))
                }
            }
        }
    };
}
literal_bool!(True, true);
literal_bool!(False, false);

impl From<&Decision> for AcquireReply {
    fn from(d: &Decision) -> Self {
        match d {
            Decision::Granted { at, permit } => {
                AcquireReply::Granted { granted: True, at: Instant(*at), permit: permit.map(|p| p.to_string()) }
            }
            Decision::Refused { retry_at, reason, limit } => AcquireReply::Refused {
                granted: False,
                retry_at: Instant(*retry_at),
                reason: reason.as_str().to_owned(),
                limit: limit.clone(),
                ticket: None,
                lapse_at: None,
                ahead: None,
                now: None,
                no_ticket: None,
            },
        }
    }
}

impl AcquireReply {
    /// The reply to a decision, naming the ticket a refusal filed or renewed.
    #[must_use]
    pub fn with_ticket(decision: &Decision, note: Option<&TicketNote>) -> Self {
        let mut reply = AcquireReply::from(decision);
        if let (AcquireReply::Refused { ticket, lapse_at, ahead, now, .. }, Some(note)) = (&mut reply, note) {
            *ticket = Some(note.id.to_string());
            *lapse_at = Some(Instant(note.lapse_at));
            *ahead = Some(note.ahead);
            *now = Some(Instant(note.now));
        }
        reply
    }

    /// The ticket a refusal names, if any.
    #[must_use]
    pub fn ticket(&self) -> Option<&str> {
        match self {
            AcquireReply::Refused { ticket, .. } => ticket.as_deref(),
            AcquireReply::Granted { .. } => None,
        }
    }
}

impl From<&Acquired> for AcquireReply {
    fn from(a: &Acquired) -> Self {
        let mut reply = AcquireReply::with_ticket(&a.decision, a.ticket.as_ref());
        if let (AcquireReply::Refused { no_ticket, .. }, Some(why)) = (&mut reply, a.no_ticket) {
            *no_ticket = Some(why.as_str().to_owned());
        }
        reply
    }
}

impl AcquireReply {
    /// A refusal's reason, or `None` for a grant or a reason the wire does not have.
    #[must_use]
    pub fn reason(&self) -> Option<Reason> {
        match self {
            AcquireReply::Granted { .. } => None,
            AcquireReply::Refused { reason, .. } => Reason::parse(reason),
        }
    }
}

/// One limit's figures (section 9.1): `used`/`remaining` for a window, `held`/`free` for
/// concurrency, `level`/`burst` for a token bucket (section 13).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitFigures {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub used: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub remaining: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub held: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub free: Option<u64>,
    /// A token bucket's level in whole tokens, rounded down (negative while in debt).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub level: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub burst: Option<u64>,
    /// The live tickets in the bucket's line (section 12.7).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub queued: Option<u64>,
    /// The ceiling an adapted limit is judged with (section 14), clamped to its `[min, max]`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ceiling: Option<u64>,
}

impl From<&Figures> for LimitFigures {
    fn from(f: &Figures) -> Self {
        LimitFigures {
            key: f.key.clone(),
            used: f.window.map(|w| w.0),
            remaining: f.window.map(|w| w.1),
            held: f.places.map(|p| p.0),
            free: f.places.map(|p| p.1),
            level: f.bucket.map(|b| b.0),
            burst: f.bucket.map(|b| b.1),
            queued: f.queued,
            ceiling: f.ceiling,
        }
    }
}

/// The figures an acquire with `report` (and every peek) adds to its reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportFields {
    pub now: Instant,
    pub limits: Vec<LimitFigures>,
}

impl From<&Report> for ReportFields {
    fn from(r: &Report) -> Self {
        ReportFields { now: Instant(r.now), limits: r.limits.iter().map(LimitFigures::from).collect() }
    }
}

/// An acquire's reply with its report: section 3's body (with its ticket, if any) plus `now`
/// and `limits`.
#[must_use]
pub fn acquire_reply_with_report(reply: &AcquireReply, report: &Report) -> serde_json::Value {
    let mut body = serde_json::to_value(reply).expect("replies always serialize");
    let fields = serde_json::to_value(ReportFields::from(report)).expect("replies always serialize");
    if let (Some(body), serde_json::Value::Object(fields)) = (body.as_object_mut(), fields) {
        body.extend(fields);
    }
    body
}

/// The reply to `peek`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeekReply {
    pub fits: bool,
    #[serde(rename = "retryAt", skip_serializing_if = "Option::is_none", default)]
    pub retry_at: Option<Instant>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub limit: Option<String>,
    pub now: Instant,
    pub limits: Vec<LimitFigures>,
}

impl From<&Peeked> for PeekReply {
    fn from(p: &Peeked) -> Self {
        PeekReply {
            fits: p.refusal.is_none(),
            retry_at: p.refusal.as_ref().map(|r| Instant(r.retry_at)),
            reason: p.refusal.as_ref().map(|r| r.reason.as_str().to_owned()),
            limit: p.refusal.as_ref().map(|r| r.limit.clone()),
            now: Instant(p.report.now),
            limits: p.report.limits.iter().map(LimitFigures::from).collect(),
        }
    }
}

impl PeekReply {
    /// The refusal an acquire would have answered, or `None` when it fits (or the reply is not
    /// well formed: a `fits: false` without its retryAt, reason and limit).
    #[must_use]
    pub fn refusal(&self) -> Option<Refusal> {
        if self.fits {
            return None;
        }
        let reason = match self.reason.as_deref()? {
            "rate" => Reason::Rate,
            "concurrency" => Reason::Concurrency,
            "throttle" => Reason::Throttle,
            _ => return None,
        };
        Some(Refusal { retry_at: self.retry_at?.0, reason, limit: self.limit.clone()? })
    }
}

/// The reply to `settle`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettleReply {
    pub settled: bool,
}

/// The reply to `lift`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiftReply {
    pub key: String,
    pub lifted: bool,
}

/// The reply to `wait` (section 15): the tickets ready and gone, at the limiter's `now`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitReply {
    pub ready: Vec<String>,
    pub gone: Vec<String>,
    pub now: Instant,
}

/// The reply to `release`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseReply {
    pub released: bool,
}

/// The reply to `throttle`: the throttle now in force, or `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThrottleReply {
    pub key: String,
    pub until: Option<Instant>,
}

/// Every error: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: ErrorBody,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

/// `GET /health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthReply {
    pub ok: bool,
    /// `redb` or `postgres`.
    pub backend: String,
    /// The file served (the redb backend only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub path: Option<String>,
    pub uptime_ms: u64,
    /// The wire version the server speaks (section 15): 4 where it keeps `/wait`, else 3.
    /// Absent from a server of an earlier release.
    #[serde(default)]
    pub wire: u32,
    /// Why the store cannot commit, while it cannot (then `ok` is false).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
}

/// `GET /state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateReply {
    pub now: Instant,
    pub buckets: Vec<BucketState>,
    pub permits: Vec<PermitState>,
    pub throttles: Vec<ThrottleState>,
    /// The adaptive ceilings kept (section 14; absent from a server before it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ceilings: Vec<CeilingState>,
    pub totals: TotalsState,
    /// More buckets, permits or throttles follow (ask again with `after`).
    #[serde(default)]
    pub truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketState {
    pub key: String,
    /// Cost counted in the window of `perMs` ending now.
    pub window_used: u64,
    /// The `calls` of the latest granted request with a window (0: none).
    pub calls: u64,
    /// The longest `perMs` granted (grants are kept this long; 0: no window).
    pub per_ms: u64,
    /// The `concurrent` of the latest granted request with one (0: none).
    pub concurrent: u64,
    pub oldest_grant: Option<Instant>,
    pub places_held: u64,
    pub next_lapse: Option<Instant>,
    /// The live tickets in its line (section 12.7; 0 from a server of wire version 2).
    #[serde(default)]
    pub queued: u64,
    /// When its first live ticket was filed, or `null` when its line is empty.
    #[serde(default)]
    pub first_ticket_at: Option<Instant>,
    /// Its first live ticket (section 12.9), or `null`: an operator may `release {ticket}` it.
    #[serde(default)]
    pub first_ticket: Option<String>,
    /// A token bucket's level in whole tokens, rounded down (section 13; absent for a bucket
    /// without one).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub level: Option<i64>,
    /// A token bucket's `burst`, beside its `level`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub burst: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermitState {
    pub permit: String,
    pub places: Vec<PlaceState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaceState {
    pub bucket: String,
    pub lapse: Instant,
}

/// One adaptive ceiling kept (section 14): its bucket, `C`, and when it was last cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CeilingState {
    pub key: String,
    pub ceiling: u64,
    #[serde(default)]
    pub last_cut_at: Option<Instant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThrottleState {
    pub key: String,
    pub until: Instant,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TotalsState {
    pub buckets: u64,
    pub permits: u64,
    pub throttles: u64,
}

impl StateReply {
    #[must_use]
    pub fn new(now: Millis, view: &StateView, totals: Totals) -> Self {
        StateReply {
            now: Instant(now),
            buckets: view
                .buckets
                .iter()
                .map(|b| BucketState {
                    key: b.key.clone(),
                    window_used: b.window_used,
                    calls: b.meta.last_calls,
                    per_ms: b.meta.retain_ms,
                    concurrent: b.meta.last_concurrent,
                    oldest_grant: b.oldest_grant.map(Instant),
                    places_held: b.places_held as u64,
                    next_lapse: b.next_lapse.map(Instant),
                    queued: b.queued as u64,
                    first_ticket_at: b.first_ticket_at.map(Instant),
                    first_ticket: b.first_ticket.map(|t| t.to_string()),
                    level: b.level.map(|l| l.0),
                    burst: b.level.map(|l| l.1),
                })
                .collect(),
            permits: view
                .permits
                .iter()
                .map(|p| PermitState {
                    permit: p.id.to_string(),
                    places: p
                        .places
                        .iter()
                        .map(|(bucket, lapse)| PlaceState { bucket: bucket.clone(), lapse: Instant(*lapse) })
                        .collect(),
                })
                .collect(),
            throttles: view
                .throttles
                .iter()
                .map(|t| ThrottleState { key: t.key.clone(), until: Instant(t.until) })
                .collect(),
            ceilings: view
                .ceilings
                .iter()
                .map(|(key, c)| CeilingState { key: key.clone(), ceiling: c.c, last_cut_at: c.cut_at.map(Instant) })
                .collect(),
            totals: TotalsState {
                buckets: totals.buckets as u64,
                permits: totals.permits as u64,
                throttles: totals.throttles as u64,
            },
            truncated: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::PermitId;

    #[test]
    fn replies_have_the_spec_form() {
        let at = Millis(1_795_921_869_123);
        let granted = AcquireReply::from(&Decision::Granted { at, permit: None });
        assert_eq!(serde_json::to_string(&granted).unwrap(), r#"{"granted":true,"at":"2026-11-29T03:11:09.123Z"}"#);
        let with_permit = AcquireReply::from(&Decision::Granted { at, permit: Some(PermitId(1)) });
        assert_eq!(
            serde_json::to_string(&with_permit).unwrap(),
            r#"{"granted":true,"at":"2026-11-29T03:11:09.123Z","permit":"p-00000000000000000000000000000001"}"#
        );
        let refused = AcquireReply::from(&Decision::Refused { retry_at: at, reason: Reason::Rate, limit: "b".into() });
        let text = serde_json::to_string(&refused).unwrap();
        assert_eq!(text, r#"{"granted":false,"retryAt":"2026-11-29T03:11:09.123Z","reason":"rate","limit":"b"}"#);
        assert_eq!(serde_json::from_str::<AcquireReply>(&text).unwrap(), refused);
        let throttle = ThrottleReply { key: "k".into(), until: None };
        assert_eq!(serde_json::to_string(&throttle).unwrap(), r#"{"key":"k","until":null}"#);
    }

    #[test]
    fn section_9_replies_have_the_spec_form() {
        let at = Millis(1_795_921_869_123);
        let report = Report {
            now: at,
            limits: vec![
                Figures {
                    key: "a/rpm".into(),
                    window: Some((50, 0)),
                    places: None,
                    bucket: None,
                    queued: None,
                    ceiling: None,
                },
                Figures {
                    key: "a/conc".into(),
                    window: None,
                    places: Some((1, 3)),
                    bucket: None,
                    queued: None,
                    ceiling: None,
                },
            ],
        };
        let refusal = Refusal { retry_at: at.plus(500), reason: Reason::Rate, limit: "a/rpm".into() };
        let peek = PeekReply::from(&Peeked { refusal: Some(refusal.clone()), report: report.clone() });
        let text = serde_json::to_string(&peek).unwrap();
        assert_eq!(
            text,
            r#"{"fits":false,"retryAt":"2026-11-29T03:11:09.623Z","reason":"rate","limit":"a/rpm","now":"2026-11-29T03:11:09.123Z","limits":[{"key":"a/rpm","used":50,"remaining":0},{"key":"a/conc","held":1,"free":3}]}"#
        );
        let back: PeekReply = serde_json::from_str(&text).unwrap();
        assert_eq!(back.refusal(), Some(refusal));
        let fits = PeekReply::from(&Peeked { refusal: None, report: report.clone() });
        assert!(!serde_json::to_string(&fits).unwrap().contains("retryAt"));
        let granted = acquire_reply_with_report(&AcquireReply::from(&Decision::Granted { at, permit: None }), &report);
        assert_eq!(granted["granted"], true);
        assert_eq!(granted["now"], "2026-11-29T03:11:09.123Z");
        assert_eq!(granted["limits"][1]["free"], 3);
        assert_eq!(
            serde_json::to_string(&LiftReply { key: "k".into(), lifted: true }).unwrap(),
            r#"{"key":"k","lifted":true}"#
        );
        assert_eq!(serde_json::to_string(&SettleReply { settled: false }).unwrap(), r#"{"settled":false}"#);
    }

    /// Section 12: a refusal naming a ticket carries `ticket`, `lapseAt`, `ahead` and `now`; a
    /// limit's figures carry `queued` when given; without them the bodies are section 3's and
    /// 9's byte for byte.
    #[test]
    fn line_replies_have_the_spec_form() {
        use crate::engine::TicketId;
        let at = Millis(1_795_921_869_123);
        let decision = Decision::Refused { retry_at: at.plus(877), reason: Reason::Rate, limit: "b".into() };
        let note = TicketNote { id: TicketId(5 << 64 | 3), lapse_at: at.plus(2877), ahead: 2, now: at };
        let text = serde_json::to_string(&AcquireReply::with_ticket(&decision, Some(&note))).unwrap();
        assert_eq!(
            text,
            r#"{"granted":false,"retryAt":"2026-11-29T03:11:10.000Z","reason":"rate","limit":"b","ticket":"t-00000000000000050000000000000003","lapseAt":"2026-11-29T03:11:12.000Z","ahead":2,"now":"2026-11-29T03:11:09.123Z"}"#
        );
        let back: AcquireReply = serde_json::from_str(&text).unwrap();
        assert_eq!(back.ticket(), Some("t-00000000000000050000000000000003"));
        // No ticket: exactly section 3's body.
        assert_eq!(
            serde_json::to_string(&AcquireReply::with_ticket(&decision, None)).unwrap(),
            r#"{"granted":false,"retryAt":"2026-11-29T03:11:10.000Z","reason":"rate","limit":"b"}"#
        );
        let granted = Decision::Granted { at, permit: None };
        assert_eq!(
            serde_json::to_string(&AcquireReply::with_ticket(&granted, Some(&note))).unwrap(),
            r#"{"granted":true,"at":"2026-11-29T03:11:09.123Z"}"#
        );
        let figures = |queued| Figures {
            key: "b".into(),
            window: Some((3, 2)),
            places: None,
            bucket: None,
            queued,
            ceiling: None,
        };
        assert_eq!(
            serde_json::to_string(&LimitFigures::from(&figures(Some(4)))).unwrap(),
            r#"{"key":"b","used":3,"remaining":2,"queued":4}"#
        );
        assert_eq!(
            serde_json::to_string(&LimitFigures::from(&figures(None))).unwrap(),
            r#"{"key":"b","used":3,"remaining":2}"#
        );
    }
}
