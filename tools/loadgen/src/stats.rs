//! Per-connection counters and latency histogram (HdrHistogram, 3 significant digits), merged
//! once the run is over into the [`Report`].

use hdrhistogram::Histogram;

use crate::conn::Plan;
use crate::{BenchArgs, Report};

/// Per-connection counters, merged after the run.
pub(crate) struct Stats {
    pub(crate) latency: Histogram<u64>,
    pub(crate) granted: u64,
    pub(crate) refused: u64,
    pub(crate) other: u64,
    pub(crate) errors: u64,
    pub(crate) reconnects: u64,
    pub(crate) connect_failures: u64,
    pub(crate) released: u64,
    pub(crate) release_errors: u64,
    pub(crate) first_error: Option<String>,
}

impl Stats {
    pub(crate) fn new() -> Stats {
        Stats {
            latency: Histogram::new(3).expect("3 significant digits is a valid precision"),
            granted: 0,
            refused: 0,
            other: 0,
            errors: 0,
            reconnects: 0,
            connect_failures: 0,
            released: 0,
            release_errors: 0,
            first_error: None,
        }
    }

    /// Records one answered acquire's latency. `record` grows the histogram as needed;
    /// `saturating_record` alone would clamp every latency past its initial range (about 2 ms)
    /// to its lowest trackable value.
    pub(crate) fn record_latency(&mut self, us: u64) {
        if self.latency.record(us).is_err() {
            self.latency.saturating_record(us);
        }
    }

    pub(crate) fn note_error(&mut self, message: impl FnOnce() -> String) {
        if self.first_error.is_none() {
            self.first_error = Some(message());
        }
    }

    pub(crate) fn merge(&mut self, other: Stats) {
        self.latency.add(&other.latency).expect("histograms that resize themselves always merge");
        self.granted += other.granted;
        self.refused += other.refused;
        self.other += other.other;
        self.errors += other.errors;
        self.reconnects += other.reconnects;
        self.connect_failures += other.connect_failures;
        self.released += other.released;
        self.release_errors += other.release_errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    pub(crate) fn into_report(
        self,
        plan: &Plan,
        args: &BenchArgs,
        seconds: f64,
        prefill_requests: u64,
        prefill_seconds: f64,
    ) -> Report {
        let answered = self.granted + self.refused + self.other;
        let h = &self.latency;
        Report {
            url: args.url.clone(),
            path: args.path.clone(),
            mix: plan.mix,
            connections: plan.connections,
            keys: plan.keys,
            calls: plan.calls,
            per_ms: plan.per_ms,
            cost: plan.cost,
            concurrent: plan.concurrent,
            requests: answered + self.errors,
            granted: self.granted,
            refused: self.refused,
            other: self.other,
            errors: self.errors,
            reconnects: self.reconnects,
            connect_failures: self.connect_failures,
            released: self.released,
            release_errors: self.release_errors,
            settle: plan.settle,
            seconds,
            rps: if seconds > 0.0 { answered as f64 / seconds } else { 0.0 },
            min_us: if h.is_empty() { 0 } else { h.min() },
            mean_us: h.mean(),
            p50_us: h.value_at_quantile(0.50),
            p95_us: h.value_at_quantile(0.95),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            prefill_requests,
            prefill_seconds,
            first_error: self.first_error,
            sink: false,
            cpu_seconds: None,
            cpu_us_per_request: None,
            cpu_share: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Stats;

    #[test]
    fn latencies_past_two_milliseconds_are_kept() {
        let mut stats = Stats::new();
        for us in [150, 4_000, 17_000, 17_000, 250_000] {
            stats.record_latency(us);
        }
        let p50 = stats.latency.value_at_quantile(0.5);
        assert!((16_900..=17_100).contains(&p50), "{p50}");
        assert!(stats.latency.max() >= 249_000, "{}", stats.latency.max());
    }
}
