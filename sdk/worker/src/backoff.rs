//! Capped exponential backoff with jitter, for reconnecting the claim stream.

use std::time::Duration;

/// Delays that double from `initial` up to `max`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        let max = max.max(initial);
        Self { initial, max, next: initial }
    }

    /// The delay before the next attempt (without jitter).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// Back to `initial` after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// `delay` spread over `[delay / 2, delay]` by `random`, so that many workers
/// that lost the same server do not all come back at the same instant.
pub(crate) fn jittered(delay: Duration, random: u64) -> Duration {
    let half = delay / 2;
    let spread = u64::try_from(half.as_micros()).unwrap_or(u64::MAX);
    half + Duration::from_micros(random % spread.saturating_add(1))
}

/// A random jittered delay for the next attempt.
pub(crate) fn next_jittered(backoff: &mut Backoff) -> Duration {
    let (random, _) = uuid::Uuid::new_v4().as_u64_pair();
    jittered(backoff.next_delay(), random)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn delays_double_up_to_the_cap_and_reset() {
        let mut backoff = Backoff::new(100 * MS, 500 * MS);
        let delays: Vec<_> = (0..5).map(|_| backoff.next_delay()).collect();
        assert_eq!(delays, [100 * MS, 200 * MS, 400 * MS, 500 * MS, 500 * MS]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), 100 * MS);
    }

    #[test]
    fn cap_below_initial_is_raised_to_initial() {
        let mut backoff = Backoff::new(100 * MS, MS);
        assert_eq!(backoff.next_delay(), 100 * MS);
        assert_eq!(backoff.next_delay(), 100 * MS);
    }

    #[test]
    fn jitter_stays_between_half_and_full_delay() {
        let delay = 1000 * MS;
        for random in [0, 1, 499_999, 500_000, 500_001, u64::MAX] {
            let jittered = jittered(delay, random);
            assert!(jittered >= delay / 2 && jittered <= delay, "{jittered:?}");
        }
        assert_eq!(jittered(delay, 0), delay / 2);
        assert_eq!(jittered(delay, 500_000), delay);
    }
}
