//! Metrics: what `/metrics` exposes, in Prometheus text format.
//!
//! It owns the registry and the handles the limiter updates (decisions by method, outcome and
//! reason, peeks, settles and lifts included; commit latency; batch size; live buckets, held places, throttles; the database's length,
//! journal included; the line's tickets filed, granted, lapsed and left, and their wait from filing to grant;
//! hand-offs: from a place released while its line waited to the next grant of a place there, and
//! the place-time that stood idle while a line waited; adaptive ceilings cut and grown). Updating a handle is a few atomic operations; nothing here touches the engine or the store.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `acquire`, `release`, `throttle`, `peek`, `settle` or `lift`.
    pub method: &'static str,
    /// `granted`/`refused` (acquire), `released`/`unknown` (release), `in_force`/`none`
    /// (throttle), `fits`/`refused` (peek), `up`/`down`/`unchanged`/`unknown` (settle: the
    /// direction any window moved, or a permit not live), `lifted`/`none` (lift), `bad_request`,
    /// or `unavailable`.
    pub outcome: &'static str,
    /// The refusal's reason (`rate`, `concurrency`, `throttle`), else empty.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CeilingLabels {
    /// `cut` or `growth` (section 14).
    pub change: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TicketLabels {
    /// `filed`, `granted`, `lapsed` or `left` (section 12).
    pub event: &'static str,
}

/// The limiter's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    pub decisions: Family<DecisionLabels, Counter>,
    pub commit_seconds: Histogram,
    pub batch_size: Histogram,
    pub live_buckets: Gauge,
    pub held_places: Gauge,
    pub throttles: Gauge,
    pub permits: Gauge,
    pub file_bytes: Gauge,
    pub tickets: Family<TicketLabels, Counter>,
    pub ticket_wait_seconds: Histogram,
    pub release_to_grant_seconds: Histogram,
    /// Place-time idle while a line waited (section 15's figure of what hand-offs cost).
    pub line_idle_place_seconds: Counter<f64, AtomicU64>,
    /// Adaptive ceilings cut and grown (section 14).
    pub ceiling_changes: Family<CeilingLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("redb_limiter");
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register("decisions", "Decisions by method, outcome and reason", decisions.clone());
        let commit_seconds =
            Histogram::new([0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5]);
        registry.register("commit_seconds", "Time of one durable commit (fsync included)", commit_seconds.clone());
        let batch_size = Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0]);
        registry.register("batch_size", "Requests decided together and sharing one commit", batch_size.clone());
        let live_buckets = Gauge::default();
        registry.register("live_buckets", "Buckets with grants in their window or held places", live_buckets.clone());
        let held_places = Gauge::default();
        registry.register("held_places", "Concurrency places held", held_places.clone());
        let throttles = Gauge::default();
        registry.register("throttles", "Caller keys throttled", throttles.clone());
        let permits = Gauge::default();
        registry.register("permits", "Permits holding places", permits.clone());
        let file_bytes = Gauge::default();
        registry.register(
            "file_bytes",
            "Length of the database as of the last commit (commits still only in the journal included)",
            file_bytes.clone(),
        );
        let tickets = Family::<TicketLabels, Counter>::default();
        registry.register("tickets", "Tickets of the line filed, granted, lapsed and left", tickets.clone());
        for event in ["filed", "granted", "lapsed", "left"] {
            let _ = tickets.get_or_create(&TicketLabels { event }); // shown from the start, at 0
        }
        let ticket_wait_seconds =
            Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0]);
        registry.register(
            "ticket_wait_seconds",
            "Wait of a granted ticket, from its filing to its grant",
            ticket_wait_seconds.clone(),
        );
        let release_to_grant_seconds =
            Histogram::new([0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0]);
        registry.register(
            "release_to_grant_seconds",
            "From a place released while its bucket's line waited to the next grant of a place there (the hand-off)",
            release_to_grant_seconds.clone(),
        );
        let line_idle_place_seconds = Counter::<f64, AtomicU64>::default();
        registry.register(
            "line_idle_place_seconds",
            "Place-time that stood idle while a line waited: from each place released while its bucket's line waited until a grant took a place there again, or until the line emptied",
            line_idle_place_seconds.clone(),
        );
        let ceiling_changes = Family::<CeilingLabels, Counter>::default();
        registry.register(
            "ceiling_changes",
            "Adaptive ceilings cut (a limited outcome) and grown (a clean one), section 14",
            ceiling_changes.clone(),
        );
        for change in ["cut", "growth"] {
            let _ = ceiling_changes.get_or_create(&CeilingLabels { change }); // shown from the start, at 0
        }
        Metrics {
            registry,
            decisions,
            commit_seconds,
            batch_size,
            live_buckets,
            held_places,
            throttles,
            permits,
            file_bytes,
            tickets,
            ticket_wait_seconds,
            release_to_grant_seconds,
            line_idle_place_seconds,
            ceiling_changes,
        }
    }
}

impl Metrics {
    /// Counts one decision.
    pub fn decided(&self, method: &'static str, outcome: &'static str, reason: &'static str) {
        self.decisions.get_or_create(&DecisionLabels { method, outcome, reason }).inc();
    }

    /// Counts a ticket's filing, lapse or leaving (`filed`, `lapsed`, `left`).
    pub fn ticket(&self, event: &'static str) {
        self.tickets.get_or_create(&TicketLabels { event }).inc();
    }

    /// Counts a ticket granted after waiting `waited_ms` since its filing.
    pub fn ticket_granted(&self, waited_ms: u64) {
        self.ticket("granted");
        self.ticket_wait_seconds.observe(waited_ms as f64 / 1000.0);
    }

    /// Counts an adaptive ceiling's `cut` or `growth`.
    pub fn ceiling_changed(&self, change: &'static str) {
        self.ceiling_changes.get_or_create(&CeilingLabels { change }).inc();
    }

    /// The registry in Prometheus text format.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String never fails");
        out
    }
}
