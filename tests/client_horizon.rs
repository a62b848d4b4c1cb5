//! The Rust client and the line's horizon (section 12.9 of the wire), against the real server
//! binary this package builds. Each test starts a server of its own on a temporary file and a
//! free port.

mod common;
use common::start_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redb_limiter::{AcquireRequest, Limit, Reason};
use redb_limiter_client::{AcquireOptions, Client, ClientError, HttpLimiter, LimiterApi, NoTicket, Outcome};

fn window(bucket: &str, per_ms: u64) -> AcquireRequest {
    AcquireRequest::new("me", vec![Limit::window(bucket, 1, per_ms)]).unwrap()
}

async fn queued(limiter: &HttpLimiter, req: &AcquireRequest) -> u64 {
    limiter.peek(req.clone()).await.unwrap().limits[0].queued.unwrap_or(0)
}

#[tokio::test]
async fn horizon_a_call_beyond_its_max_wait_gets_no_ticket_and_times_out_at_once() {
    let server = start_server(&[]);
    let limiter = Arc::new(HttpLimiter::new(&server.url, None));
    let client = Client::new(limiter.clone());
    let req = window("rpm", 60_000);
    client.try_acquire(req.clone()).await.unwrap();
    let started = Instant::now();
    let options = AcquireOptions { max_wait: Some(Duration::from_secs(1)), ..AcquireOptions::default() };
    match client.acquire(req.clone(), options).await {
        Err(ClientError::QueueTimeout { last: Some(last), .. }) => {
            assert!(started.elapsed() < Duration::from_millis(500), "gave up after {:?}", started.elapsed());
            assert_eq!((last.reason, last.line), (Reason::Rate, None));
            assert_eq!(last.no_ticket, Some(NoTicket::Horizon));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(queued(&limiter, &req).await, 0);
}

#[tokio::test]
async fn horizon_without_max_wait_the_servers_own_files_no_ticket() {
    let server = start_server(&[]);
    let limiter = HttpLimiter::new(&server.url, None);
    // Ten minutes out: beyond the server's horizon (300 s by default), and no maxWaitMs sent.
    let req = window("10min", 600_000);
    limiter.acquire(req.clone()).await.unwrap();
    let queue = AcquireRequest { queue: true, ..req.clone() };
    match limiter.acquire_within(queue, None).await.unwrap() {
        Outcome::Refused(refused) => {
            assert_eq!((refused.line, refused.no_ticket), (None, Some(NoTicket::Horizon)));
        }
        granted => panic!("{granted:?}"),
    }
    assert_eq!(queued(&limiter, &req).await, 0);
}

#[tokio::test]
async fn horizon_a_call_within_its_max_wait_still_takes_a_ticket_and_is_served_with_it() {
    let server = start_server(&[]);
    let limiter = HttpLimiter::new(&server.url, None);
    let req = window("rps", 500);
    limiter.acquire(req.clone()).await.unwrap();
    let max_wait = Some(Duration::from_secs(5));
    let queue = AcquireRequest { queue: true, ..req.clone() };
    let (ticket, wait) = match limiter.acquire_within(queue, max_wait).await.unwrap() {
        Outcome::Refused(refused) => {
            assert_eq!(refused.no_ticket, None);
            let line = refused.line.expect("a ticket within the horizon");
            (line.ticket, refused.retry_at.since(line.now))
        }
        granted => panic!("{granted:?}"),
    };
    assert_eq!(queued(&limiter, &req).await, 1);
    tokio::time::sleep(Duration::from_millis(wait + 20)).await;
    let again = AcquireRequest { ticket: Some(ticket), ..req.clone() };
    assert!(matches!(limiter.acquire_within(again, max_wait).await.unwrap(), Outcome::Granted { .. }));
    assert_eq!(queued(&limiter, &req).await, 0);
}
