//! The waiting acquire and section 12.9 of the wire, over a scripted limiter on paused tokio time
//! (no server): every ask in the line is told what remains of `max_wait`, a refusal that files no
//! ticket leaves none standing, and one whose `retryAt` lies past the deadline ends the wait at
//! once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redb_limiter::{AcquireRequest, Cost, Limit, Millis, Reason};
use redb_limiter_client::{
    AcquireOptions, Client, ClientError, InLine, LimiterApi, NoTicket, Outcome, PeekOutcome, Refusal,
};

const T0: Millis = Millis(1_800_000_000_000);

/// One ask as the limiter saw it: the ticket presented, `queue`, and the wait it was told.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ask {
    ticket: Option<String>,
    queue: bool,
    max_wait: Option<Duration>,
}

/// What the limiter answers: a grant, or a refusal `in_ms` from now, with a ticket or a reason
/// for none.
enum Answer {
    Grant,
    Refuse { in_ms: u64, ticket: Option<&'static str>, no_ticket: Option<NoTicket> },
}

/// A limiter whose acquires answer from a script, on tokio's (paused) clock.
struct Scripted {
    start: tokio::time::Instant,
    answers: Mutex<VecDeque<Answer>>,
    asks: Mutex<Vec<Ask>>,
    left: Mutex<Vec<String>>,
}

impl Scripted {
    fn new(answers: impl IntoIterator<Item = Answer>) -> Arc<Self> {
        Arc::new(Scripted {
            start: tokio::time::Instant::now(),
            answers: Mutex::new(answers.into_iter().collect()),
            asks: Mutex::default(),
            left: Mutex::default(),
        })
    }

    fn asks(&self) -> Vec<Ask> {
        self.asks.lock().unwrap().clone()
    }

    fn left(&self) -> Vec<String> {
        self.left.lock().unwrap().clone()
    }
}

impl LimiterApi for Scripted {
    async fn acquire(&self, req: AcquireRequest) -> Result<Outcome, ClientError> {
        self.acquire_within(req, None).await
    }

    async fn acquire_within(&self, req: AcquireRequest, max_wait: Option<Duration>) -> Result<Outcome, ClientError> {
        self.asks.lock().unwrap().push(Ask { ticket: req.ticket.clone(), queue: req.queue, max_wait });
        let now = self.now();
        Ok(match self.answers.lock().unwrap().pop_front().expect("an answer scripted for every ask") {
            Answer::Grant => Outcome::Granted { at: now, permit: None },
            Answer::Refuse { in_ms, ticket, no_ticket } => {
                let retry_at = now.plus(in_ms);
                let line = ticket.map(|t| InLine { ticket: t.into(), lapse_at: retry_at.plus(2_000), ahead: 0, now });
                Outcome::Refused(Refusal {
                    retry_at,
                    reason: Reason::Rate,
                    limit: "a/rpm".into(),
                    line,
                    no_ticket,
                    figures: Vec::new(),
                })
            }
        })
    }

    async fn leave(&self, ticket: String) -> Result<bool, ClientError> {
        self.left.lock().unwrap().push(ticket);
        Ok(true)
    }

    async fn release(&self, _permit: String) -> Result<bool, ClientError> {
        Ok(true)
    }

    async fn throttle(&self, _key: String, until: Millis) -> Result<Option<Millis>, ClientError> {
        Ok(Some(until))
    }

    async fn peek(&self, _req: AcquireRequest) -> Result<PeekOutcome, ClientError> {
        Ok(PeekOutcome { refusal: None, now: self.now(), limits: Vec::new() })
    }

    async fn settle(&self, _permit: String, _costs: Vec<Cost>) -> Result<bool, ClientError> {
        Ok(true)
    }

    async fn release_with_costs(&self, _permit: String, _costs: Vec<Cost>) -> Result<bool, ClientError> {
        Ok(true)
    }

    async fn lift(&self, _key: String) -> Result<bool, ClientError> {
        Ok(false)
    }

    fn now(&self) -> Millis {
        T0.plus(self.start.elapsed().as_millis() as u64)
    }
}

fn req() -> AcquireRequest {
    AcquireRequest::new("me", vec![Limit::window("a/rpm", 1, 60_000)]).unwrap()
}

fn within(max_wait: Duration) -> AcquireOptions {
    AcquireOptions { max_wait: Some(max_wait), ..AcquireOptions::default() }
}

fn refuse(in_ms: u64, ticket: Option<&'static str>, no_ticket: Option<NoTicket>) -> Answer {
    Answer::Refuse { in_ms, ticket, no_ticket }
}

#[tokio::test(start_paused = true)]
async fn every_ask_in_the_line_is_told_what_remains_of_max_wait() {
    let limiter = Scripted::new([refuse(100, Some("t-1"), None), refuse(250, Some("t-1"), None), Answer::Grant]);
    let client = Client::new(limiter.clone());
    client.acquire(req(), within(Duration::from_secs(5))).await.unwrap();
    let told: Vec<_> = limiter.asks().iter().map(|a| a.max_wait).collect();
    let ms = Duration::from_millis;
    assert_eq!(told, [Some(ms(5_000)), Some(ms(4_900)), Some(ms(4_650))]);
    let tickets: Vec<_> = limiter.asks().into_iter().map(|a| a.ticket).collect();
    assert_eq!(tickets, [None, Some("t-1".into()), Some("t-1".into())]);
    // Without a maximum wait, none is told (the limiter's own horizon stands); nor by try_acquire.
    let limiter = Scripted::new([Answer::Grant, Answer::Grant]);
    let client = Client::new(limiter.clone());
    client.acquire(req(), AcquireOptions::default()).await.unwrap();
    client.try_acquire(req()).await.unwrap();
    assert_eq!(limiter.asks().iter().map(|a| a.max_wait).collect::<Vec<_>>(), [None, None]);
}

#[tokio::test(start_paused = true)]
async fn a_no_ticket_horizon_refusal_past_max_wait_ends_the_wait_at_once() {
    let limiter = Scripted::new([refuse(60_000, None, Some(NoTicket::Horizon))]);
    let client = Client::new(limiter.clone());
    let started = tokio::time::Instant::now();
    match client.acquire(req(), within(Duration::from_secs(5))).await {
        Err(ClientError::QueueTimeout { waited_ms, last: Some(last) }) => {
            assert_eq!(waited_ms, 0, "it did not sleep towards a retryAt it could not reach");
            assert_eq!((last.reason, last.no_ticket, last.line), (Reason::Rate, Some(NoTicket::Horizon), None));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(limiter.left().is_empty(), "no ticket was filed: none to leave");
}

#[tokio::test(start_paused = true)]
async fn after_a_no_ticket_refusal_no_stale_ticket_is_presented() {
    let limiter = Scripted::new([
        refuse(30, Some("t-1"), None),
        refuse(30, None, Some(NoTicket::Full)),
        refuse(30, Some("t-2"), None),
        Answer::Grant,
    ]);
    let client = Client::new(limiter.clone());
    client.acquire(req(), within(Duration::from_secs(5))).await.unwrap();
    let asks: Vec<_> = limiter.asks().into_iter().map(|a| (a.queue, a.ticket)).collect();
    assert_eq!(
        asks,
        [(true, None), (true, Some("t-1".into())), (true, None), (true, Some("t-2".into()))],
        "it asks to join the line again, presenting nothing stale"
    );
    assert!(limiter.left().is_empty(), "granted: no ticket to leave");
}

#[tokio::test(start_paused = true)]
async fn a_no_ticket_refusal_within_max_wait_is_waited_out_on_its_retry_at() {
    let limiter = Scripted::new([refuse(400, None, Some(NoTicket::Horizon)), Answer::Grant]);
    let client = Client::new(limiter.clone());
    let started = tokio::time::Instant::now();
    client.acquire(req(), within(Duration::from_secs(1))).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(400));
    assert_eq!(limiter.asks()[1].max_wait, Some(Duration::from_millis(600)));
}
