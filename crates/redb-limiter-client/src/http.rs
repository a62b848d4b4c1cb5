//! [`HttpLimiter`]: the methods of the wire over HTTP, against any limiter that serves it.

use reqwest::StatusCode;
use serde::de::DeserializeOwned;

use crate::{ClientError, InLine, LimiterApi, Outcome, PeekOutcome, Refusal};
use redb_limiter::engine::Figures;
use redb_limiter::request::{AcquireRequest, Cost, LeaveRequest, ReleaseRequest, SettleRequest};
use redb_limiter::time::{Millis, format_instant};
use redb_limiter::wire::{
    AcquireReply, ErrorReply, LiftReply, LimitFigures, PeekReply, ReleaseReply, SettleReply, ThrottleReply,
};

/// One limit's figures as the wire gave them.
fn figures(f: LimitFigures) -> Figures {
    Figures { key: f.key, window: f.used.zip(f.remaining), places: f.held.zip(f.free), queued: f.queued }
}

/// A remote limiter at `url` (for example `http://127.0.0.1:7411`), with an optional token.
#[derive(Debug, Clone)]
pub struct HttpLimiter {
    url: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl HttpLimiter {
    #[must_use]
    pub fn new(url: impl Into<String>, token: Option<String>) -> Self {
        HttpLimiter { url: url.into().trim_end_matches('/').to_owned(), token, http: reqwest::Client::new() }
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
        Ok(match self.post::<AcquireReply>("acquire", req.to_json()).await? {
            AcquireReply::Granted { at, permit, .. } => Outcome::Granted { at: at.0, permit },
            reply @ AcquireReply::Refused { .. } => {
                let reason = reply.reason();
                let AcquireReply::Refused { retry_at, limit, reason: named, ticket, lapse_at, ahead, now, .. } = reply
                else {
                    unreachable!("matched above")
                };
                let reason =
                    reason.ok_or_else(|| ClientError::Protocol(format!("acquire: unknown reason {named:?}")))?;
                let line = match (ticket, lapse_at, ahead, now) {
                    (None, ..) => None,
                    (Some(ticket), Some(lapse_at), Some(ahead), Some(now)) => {
                        Some(InLine { ticket, lapse_at: lapse_at.0, ahead, now: now.0 })
                    }
                    (Some(_), ..) => {
                        return Err(ClientError::Protocol("acquire: a ticket without lapseAt, ahead and now".into()));
                    }
                };
                Outcome::Refused(Refusal { retry_at: retry_at.0, reason, limit, line })
            }
        })
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
}
