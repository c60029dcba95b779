//! Latency summaries: nearest-rank percentiles over every recorded sample.

use serde::Serialize;

/// A latency distribution, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct LatencySummary {
    pub(crate) samples: u64,
    pub(crate) mean_ms: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
}

impl LatencySummary {
    /// Summarises samples given in microseconds (all zeros when there are none).
    pub(crate) fn from_micros(mut micros: Vec<u64>) -> Self {
        if micros.is_empty() {
            return Self::default();
        }
        micros.sort_unstable();
        let total: u128 = micros.iter().map(|&value| u128::from(value)).sum();
        let count = micros.len();
        Self {
            samples: count as u64,
            mean_ms: total as f64 / count as f64 / 1000.0,
            p50_ms: to_ms(percentile(&micros, 50.0)),
            p90_ms: to_ms(percentile(&micros, 90.0)),
            p99_ms: to_ms(percentile(&micros, 99.0)),
            max_ms: to_ms(micros[count - 1]),
        }
    }
}

/// The nearest-rank percentile of sorted, non-empty samples.
fn percentile(sorted: &[u64], pct: f64) -> u64 {
    let rank = (pct / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn to_ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_of_one_to_a_hundred() {
        let summary = LatencySummary::from_micros((1..=100).rev().map(|ms| ms * 1000).collect());
        assert_eq!(summary.samples, 100);
        assert_eq!(summary.p50_ms, 50.0);
        assert_eq!(summary.p90_ms, 90.0);
        assert_eq!(summary.p99_ms, 99.0);
        assert_eq!(summary.max_ms, 100.0);
        assert!((summary.mean_ms - 50.5).abs() < 1e-9);
    }

    #[test]
    fn one_sample_is_every_percentile() {
        let summary = LatencySummary::from_micros(vec![1500]);
        assert_eq!((summary.p50_ms, summary.p99_ms, summary.max_ms), (1.5, 1.5, 1.5));
    }

    #[test]
    fn no_samples_give_zeros() {
        assert_eq!(LatencySummary::from_micros(Vec::new()), LatencySummary::default());
    }
}
