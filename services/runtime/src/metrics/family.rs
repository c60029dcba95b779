//! Counters, gauges and histograms in labelled families, written out in the
//! Prometheus text format 0.0.4.
//!
//! A family holds one series per label values; every label value a caller
//! passes must come from a bounded set (a state, a route template, a method
//! of a known service), never from a request's ids or namespace.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::Duration,
};

/// What a family is made of: one series' value and how it is written.
pub trait Metric: Default + Send + Sync {
    /// The `# TYPE` of the family.
    const KIND: &'static str;

    /// Writes this series' sample lines; `labels` is `a="x",b="y"` (maybe empty).
    fn encode(&self, name: &str, labels: &str, out: &mut String);
}

/// A value that only goes up.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.inc_by(1);
    }

    pub fn inc_by(&self, amount: u64) {
        self.0.fetch_add(amount, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Metric for Counter {
    const KIND: &'static str = "counter";

    fn encode(&self, name: &str, labels: &str, out: &mut String) {
        sample(out, name, "", labels, self.get());
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn set(&self, value: i64) {
        self.0.store(value, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Counts one more while the returned guard lives.
    pub fn hold(self: Arc<Self>) -> Held {
        self.inc();
        Held(self)
    }
}

/// One counted in a [`Gauge`] until dropped.
#[derive(Debug)]
pub struct Held(Arc<Gauge>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metric for Gauge {
    const KIND: &'static str = "gauge";

    fn encode(&self, name: &str, labels: &str, out: &mut String) {
        sample(out, name, "", labels, self.get());
    }
}

/// Upper bounds (seconds) of a request-latency histogram's buckets: from a
/// cached read to a call that waits on a slow database.
const LATENCY_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

/// Durations counted in latency buckets, with their sum and count.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations at most each bound (not cumulative: summed when written).
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    sum_nanos: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        if let Some(bucket) = LATENCY_BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl Metric for Histogram {
    const KIND: &'static str = "histogram";

    fn encode(&self, name: &str, labels: &str, out: &mut String) {
        let separator = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            sample(out, name, "_bucket", &format!("{labels}{separator}le=\"{bound}\""), cumulative);
        }
        let count = self.count();
        sample(out, name, "_bucket", &format!("{labels}{separator}le=\"+Inf\""), count);
        let sum = Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed)).as_secs_f64();
        sample(out, name, "_sum", labels, sum);
        sample(out, name, "_count", labels, count);
    }
}

fn sample(out: &mut String, name: &str, suffix: &str, labels: &str, value: impl std::fmt::Display) {
    let _ = match labels.is_empty() {
        true => writeln!(out, "{name}{suffix} {value}"),
        false => writeln!(out, "{name}{suffix}{{{labels}}} {value}"),
    };
}

/// One metric's series, one per value of its `N` labels.
#[derive(Debug)]
pub struct Family<const N: usize, M> {
    name: &'static str,
    help: &'static str,
    labels: [&'static str; N],
    series: Mutex<BTreeMap<[String; N], Arc<M>>>,
}

impl<const N: usize, M: Metric> Family<N, M> {
    pub fn new(name: &'static str, help: &'static str, labels: [&'static str; N]) -> Self {
        Self { name, help, labels, series: Mutex::default() }
    }

    /// The series of `values` (one per label, in order), made on first use.
    pub fn with(&self, values: [&str; N]) -> Arc<M> {
        let mut series = self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(series.entry(values.map(str::to_owned)).or_default())
    }

    /// Writes the family: its help, its type and every series.
    pub fn encode(&self, out: &mut String) {
        let help = self.help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(out, "# HELP {} {help}\n# TYPE {} {}", self.name, self.name, M::KIND);
        let series = self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if N == 0 && series.is_empty() {
            // A series without labels exists from the start, at zero.
            M::default().encode(self.name, "", out);
        }
        for (values, metric) in series.iter() {
            metric.encode(self.name, &self.label_pairs(values), out);
        }
    }

    fn label_pairs(&self, values: &[String; N]) -> String {
        let pairs: Vec<String> = self
            .labels
            .iter()
            .zip(values)
            .map(|(label, value)| {
                let value = value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                format!("{label}=\"{value}\"")
            })
            .collect();
        pairs.join(",")
    }
}

impl<M: Metric> Family<0, M> {
    /// The one series of a family without labels.
    pub fn get(&self) -> Arc<M> {
        self.with([])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_written_per_label_values_with_escaping() {
        let family = Family::<2, Counter>::new("chorus_things_total", "Things.", ["kind", "state"]);
        family.with(["a", "done"]).inc();
        family.with(["a", "done"]).inc_by(2);
        family.with(["say \"hi\"\\", "x"]).inc();
        let mut out = String::new();
        family.encode(&mut out);
        assert_eq!(
            out,
            "# HELP chorus_things_total Things.\n# TYPE chorus_things_total counter\n\
             chorus_things_total{kind=\"a\",state=\"done\"} 3\n\
             chorus_things_total{kind=\"say \\\"hi\\\"\\\\\",state=\"x\"} 1\n"
        );
    }

    #[test]
    fn a_family_without_labels_shows_zero_before_its_first_count() {
        let family = Family::<0, Counter>::new("chorus_empty_total", "Nothing yet.", []);
        let mut out = String::new();
        family.encode(&mut out);
        assert!(out.ends_with("\nchorus_empty_total 0\n"), "{out}");
        family.get().inc();
        let mut out = String::new();
        family.encode(&mut out);
        assert!(out.ends_with("\nchorus_empty_total 1\n"), "{out}");
    }

    #[test]
    fn histograms_write_cumulative_buckets_sum_and_count() {
        let family = Family::<1, Histogram>::new("chorus_latency_seconds", "Latency.", ["method"]);
        let histogram = family.with(["Get"]);
        histogram.observe(Duration::from_micros(500));
        histogram.observe(Duration::from_millis(20));
        histogram.observe(Duration::from_secs(60));
        let mut out = String::new();
        family.encode(&mut out);
        assert!(out.contains("chorus_latency_seconds_bucket{method=\"Get\",le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("chorus_latency_seconds_bucket{method=\"Get\",le=\"0.025\"} 2\n"), "{out}");
        assert!(out.contains("chorus_latency_seconds_bucket{method=\"Get\",le=\"10\"} 2\n"), "{out}");
        assert!(out.contains("chorus_latency_seconds_bucket{method=\"Get\",le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("chorus_latency_seconds_sum{method=\"Get\"} 60.0205\n"), "{out}");
        assert!(out.contains("chorus_latency_seconds_count{method=\"Get\"} 3\n"), "{out}");
    }
}
