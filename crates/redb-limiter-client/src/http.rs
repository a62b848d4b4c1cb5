//! [`HttpLimiter`]: the methods of the wire over HTTP, against any limiter that serves it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{ClientError, InLine, LimiterApi, NoTicket, Outcome, PeekOutcome, Refusal, Waited};
use redb_limiter::engine::Figures;
use redb_limiter::request::{AcquireRequest, Cost, LeaveRequest, ReleaseRequest, SettleRequest, Signal, UndoRequest};
use redb_limiter::time::{Millis, format_instant};
use redb_limiter::wire::{
    AcquireReply, ErrorReply, LiftReply, LimitFigures, PeekReply, ReleaseReply, SettleReply, ThrottleReply, WaitReply,
};

/// An acquire's body: in the line (`queue` or a `ticket`), with what remains of the host's wait
/// as `maxWaitMs` (section 12.9); outside it, or with no `max_wait`, without.
fn acquire_body(req: &AcquireRequest, max_wait: Option<Duration>) -> Value {
    let mut body = req.to_json();
    if let Some(ms) = crate::max_wait_ms(req, max_wait) {
        body["maxWaitMs"] = Value::from(ms);
    }
    body
}

/// An acquire's reply as the client's [`Outcome`], `noTicket` and a refusal's reported figures
/// included.
fn acquire_outcome(reply: Value) -> Result<Outcome, ClientError> {
    let no_ticket = reply.get("noTicket").and_then(Value::as_str).and_then(NoTicket::parse);
    let reported = match reply.get("limits") {
        None => Vec::new(),
        Some(limits) => Vec::<LimitFigures>::deserialize(limits)
            .map_err(|e| ClientError::Protocol(format!("acquire: limits: {e}")))?,
    };
    let reply = AcquireReply::deserialize(reply).map_err(|e| ClientError::Protocol(format!("acquire: {e}")))?;
    Ok(match reply {
        AcquireReply::Granted { at, permit, .. } => Outcome::Granted { at: at.0, permit },
        reply @ AcquireReply::Refused { .. } => {
            let reason = reply.reason();
            let AcquireReply::Refused { retry_at, limit, reason: named, ticket, lapse_at, ahead, now, .. } = reply
            else {
                unreachable!("matched above")
            };
            let reason = reason.ok_or_else(|| ClientError::Protocol(format!("acquire: unknown reason {named:?}")))?;
            let line = match (ticket, lapse_at, ahead, now) {
                (None, ..) => None,
                (Some(ticket), Some(lapse_at), Some(ahead), Some(now)) => {
                    Some(InLine { ticket, lapse_at: lapse_at.0, ahead, now: now.0 })
                }
                (Some(_), ..) => {
                    return Err(ClientError::Protocol("acquire: a ticket without lapseAt, ahead and now".into()));
                }
            };
            let figures = reported.into_iter().map(figures).collect();
            Outcome::Refused(Refusal { retry_at: retry_at.0, reason, limit, line, no_ticket, figures })
        }
    })
}

/// One limit's figures as the wire gave them.
fn figures(f: LimitFigures) -> Figures {
    Figures {
        key: f.key,
        window: f.used.zip(f.remaining),
        places: f.held.zip(f.free),
        bucket: f.level.zip(f.burst),
        queued: f.queued,
        ceiling: f.ceiling,
    }
}

/// A remote limiter at `url` (for example `http://127.0.0.1:7411`), with an optional token.
#[derive(Debug, Clone)]
pub struct HttpLimiter {
    url: String,
    token: Option<String>,
    http: reqwest::Client,
    /// The server answered `/wait` with 404 (it keeps no waits, section 15): not asked again.
    no_waits: Arc<AtomicBool>,
}

impl HttpLimiter {
    #[must_use]
    pub fn new(url: impl Into<String>, token: Option<String>) -> Self {
        HttpLimiter {
            url: url.into().trim_end_matches('/').to_owned(),
            token,
            http: reqwest::Client::new(),
            no_waits: Arc::default(),
        }
    }

    /// Gives up on any call after `timeout` (`Unreachable`). A [`crate::Client`] undoes an
    /// acquire it gave up on by its request id (section 16), so nothing it may have been granted
    /// stays held.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.http = reqwest::Client::builder().timeout(timeout).build().unwrap_or_default();
        self
    }

    /// A request to `path` (starting with `/`) on the server, carrying the bearer token when
    /// one is set: every call of the wire, and reads such as `/state`, are built here.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.url));
        match &self.token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    /// The server's URL, without a trailing slash.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    async fn post<T: DeserializeOwned>(&self, method: &str, body: serde_json::Value) -> Result<T, ClientError> {
        let req = self.request(reqwest::Method::POST, &format!("/{method}")).json(&body);
        let resp = req.send().await.map_err(|e| ClientError::Unreachable(format!("{}: {e}", self.url)))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| ClientError::Unreachable(format!("{}: {e}", self.url)))?;
        if status == StatusCode::OK {
            return serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(format!("{method}: {e}")));
        }
        let message = serde_json::from_slice::<ErrorReply>(&bytes)
            .map(|r| r.error.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
        Err(match status {
            StatusCode::BAD_REQUEST => ClientError::BadRequest(message),
            StatusCode::SERVICE_UNAVAILABLE => ClientError::Unavailable(message),
            other => ClientError::Protocol(format!("{method} answered {other}: {message}")),
        })
    }
}

impl LimiterApi for HttpLimiter {
    async fn acquire(&self, req: AcquireRequest) -> Result<Outcome, ClientError> {
        self.acquire_within(req, None).await
    }

    async fn acquire_within(&self, req: AcquireRequest, max_wait: Option<Duration>) -> Result<Outcome, ClientError> {
        acquire_outcome(self.post::<Value>("acquire", acquire_body(&req, max_wait)).await?)
    }

    async fn release(&self, permit: String) -> Result<bool, ClientError> {
        Ok(self.post::<ReleaseReply>("release", serde_json::json!({ "permit": permit })).await?.released)
    }

    async fn throttle(&self, key: String, until: Millis) -> Result<Option<Millis>, ClientError> {
        let body = serde_json::json!({ "key": key, "until": format_instant(until) });
        Ok(self.post::<ThrottleReply>("throttle", body).await?.until.map(|i| i.0))
    }

    async fn peek(&self, req: AcquireRequest) -> Result<PeekOutcome, ClientError> {
        let reply = self.post::<PeekReply>("peek", req.to_json()).await?;
        let refusal = match (reply.fits, reply.refusal()) {
            (true, _) => None,
            (false, Some(r)) => Some(Refusal::new(r.retry_at, r.reason, r.limit)),
            (false, None) => {
                return Err(ClientError::Protocol("peek: fits false without retryAt, reason and limit".into()));
            }
        };
        Ok(PeekOutcome { refusal, now: reply.now.0, limits: reply.limits.into_iter().map(figures).collect() })
    }

    async fn settle(&self, permit: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        let req = SettleRequest::new(permit, costs).map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(self.post::<SettleReply>("settle", req.to_json()).await?.settled)
    }

    async fn release_with_costs(&self, permit: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        let req = ReleaseRequest::with_costs(permit, costs).map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(self.post::<ReleaseReply>("release", req.to_json()).await?.released)
    }

    async fn leave(&self, ticket: String) -> Result<bool, ClientError> {
        let req = LeaveRequest::new(ticket).map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(self.post::<ReleaseReply>("release", req.to_json()).await?.released)
    }

    async fn lift(&self, key: String) -> Result<bool, ClientError> {
        Ok(self.post::<LiftReply>("lift", serde_json::json!({ "key": key })).await?.lifted)
    }

    async fn wait(&self, tickets: Vec<String>, timeout: Duration) -> Result<Option<Waited>, ClientError> {
        if self.no_waits.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let timeout_ms = timeout.clamp(crate::WAIT_TIMEOUT.0, crate::WAIT_TIMEOUT.1).as_millis() as u64;
        let body = serde_json::json!({ "tickets": tickets, "timeoutMs": timeout_ms });
        // The wait's own time, and a margin for the answer, whatever the client's timeout.
        let within = Duration::from_millis(timeout_ms) + Duration::from_secs(5);
        let resp = self.request(reqwest::Method::POST, "/wait").json(&body).timeout(within).send().await;
        let resp = resp.map_err(|e| ClientError::Unreachable(format!("{}: {e}", self.url)))?;
        if resp.status() == StatusCode::NOT_FOUND {
            self.no_waits.store(true, Ordering::Relaxed);
            return Ok(None);
        }
        if resp.status() != StatusCode::OK {
            return Err(ClientError::Protocol(format!("wait answered {}", resp.status())));
        }
        let reply: WaitReply = resp.json().await.map_err(|e| ClientError::Protocol(format!("wait: {e}")))?;
        Ok(Some(Waited { ready: reply.ready, gone: reply.gone }))
    }

    async fn release_outcome(&self, permit: String, costs: Vec<Cost>, outcome: Signal) -> Result<bool, ClientError> {
        let req = crate::release_request(permit, costs, outcome)?;
        Ok(self.post::<ReleaseReply>("release", req.to_json()).await?.released)
    }

    async fn settle_outcome(&self, permit: String, costs: Vec<Cost>, outcome: Signal) -> Result<bool, ClientError> {
        let req = SettleRequest::new(permit, costs).map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(self.post::<SettleReply>("settle", req.with_outcome(outcome).to_json()).await?.settled)
    }

    async fn throttle_permit(&self, key: String, until: Millis, permit: String) -> Result<Option<Millis>, ClientError> {
        let body = serde_json::json!({ "key": key, "until": format_instant(until), "permit": permit });
        Ok(self.post::<ThrottleReply>("throttle", body).await?.until.map(|i| i.0))
    }

    async fn undo(&self, id: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        let req = UndoRequest::with_costs(id, costs);
        let req = req.map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(self.post::<ReleaseReply>("release", req.to_json()).await?.released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb_limiter::{Limit, Reason};

    fn req() -> AcquireRequest {
        AcquireRequest::new("me", vec![Limit::window("a/rpm", 1, 60_000)]).unwrap()
    }

    fn queued() -> AcquireRequest {
        AcquireRequest { queue: true, ..req() }
    }

    #[test]
    fn in_the_line_max_wait_is_sent_as_max_wait_ms_rounded_up_and_clamped() {
        let sent = |req: &AcquireRequest, max_wait| acquire_body(req, max_wait).get("maxWaitMs").cloned();
        assert_eq!(sent(&queued(), Some(Duration::from_millis(1_500))), Some(Value::from(1_500)));
        assert_eq!(sent(&queued(), Some(Duration::from_micros(1_499_001))), Some(Value::from(1_500)));
        assert_eq!(sent(&queued(), Some(Duration::ZERO)), Some(Value::from(1)), "at least 1 ms");
        assert_eq!(sent(&queued(), Some(Duration::from_secs(30 * 86_400))), Some(Value::from(86_400_000)));
        assert_eq!(sent(&queued(), Some(Duration::MAX)), Some(Value::from(86_400_000)));
        let with_ticket = AcquireRequest { ticket: Some("t-1".into()), ..req() };
        assert_eq!(sent(&with_ticket, Some(Duration::from_secs(2))), Some(Value::from(2_000)));
        // No maximum wait (the limiter's horizon stands), or no line: no maxWaitMs.
        assert_eq!(sent(&queued(), None), None);
        assert_eq!(sent(&req(), Some(Duration::from_secs(2))), None);
        assert_eq!(acquire_body(&queued(), None), queued().to_json());
    }

    fn refused(extra: Value) -> Value {
        let mut reply = serde_json::json!({
            "granted": false, "retryAt": "2026-11-30T03:11:10.000Z", "reason": "rate", "limit": "a/rpm",
        });
        reply.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        reply
    }

    #[test]
    fn a_refusals_no_ticket_is_read_as_horizon_or_full_and_nothing_else() {
        let no_ticket = |extra| match acquire_outcome(refused(extra)).unwrap() {
            Outcome::Refused(r) => {
                assert_eq!((r.reason, r.line), (Reason::Rate, None));
                r.no_ticket
            }
            granted => panic!("{granted:?}"),
        };
        assert_eq!(no_ticket(serde_json::json!({ "noTicket": "horizon" })), Some(NoTicket::Horizon));
        assert_eq!(no_ticket(serde_json::json!({ "noTicket": "full" })), Some(NoTicket::Full));
        assert_eq!(no_ticket(serde_json::json!({})), None);
        // A cause this client does not know (a later wire) reads as unsaid.
        assert_eq!(no_ticket(serde_json::json!({ "noTicket": "weather" })), None);
        // Not a string at all: the reply is not the wire's.
        assert!(matches!(
            acquire_outcome(refused(serde_json::json!({ "noTicket": 7 }))),
            Err(ClientError::Protocol(_))
        ));
        assert_eq!(NoTicket::Horizon.as_str(), "horizon");
        assert_eq!(NoTicket::parse(NoTicket::Full.as_str()), Some(NoTicket::Full));
    }

    #[test]
    fn a_ticketed_refusal_and_a_grant_read_as_before() {
        let ticketed = serde_json::json!({
            "ticket": "t-1", "lapseAt": "2026-11-30T03:11:12.000Z", "ahead": 2, "now": "2026-11-30T03:11:09.500Z",
        });
        match acquire_outcome(refused(ticketed)).unwrap() {
            Outcome::Refused(Refusal { line: Some(line), no_ticket: None, .. }) => {
                assert_eq!((line.ticket.as_str(), line.ahead), ("t-1", 2));
            }
            other => panic!("{other:?}"),
        }
        let granted = serde_json::json!({ "granted": true, "at": "2026-11-30T03:11:09.123Z", "permit": "p-1" });
        assert!(matches!(acquire_outcome(granted).unwrap(), Outcome::Granted { permit: Some(p), .. } if p == "p-1"));
        let garbled = serde_json::json!({ "granted": "maybe" });
        assert!(matches!(acquire_outcome(garbled), Err(ClientError::Protocol(_))));
    }
}
