//! A failure that repeats, said once: a background loop that calls another
//! service every few seconds would otherwise log the same warning at each
//! round for as long as that service is down.

/// The state of one repeated call: failing or not.
#[derive(Debug, Default)]
pub struct Outage {
    failing: bool,
}

impl Outage {
    /// `what` (an action: "renewing the leases") failed: a warning when the
    /// outage starts, debug lines while it lasts.
    fn failed(&mut self, what: &str, error: &str) {
        if std::mem::replace(&mut self.failing, true) {
            tracing::debug!(error, "{what} still fails");
        } else {
            tracing::warn!(error, "{what} fails; trying again, and saying so once it works");
        }
    }

    /// `what` worked: the end of an outage is said.
    fn passed(&mut self, what: &str) {
        if std::mem::take(&mut self.failing) {
            tracing::info!("{what} works again");
        }
    }

    /// Says how `what` went this time: a warning when an outage starts,
    /// debug lines while it lasts, a line when it ends.
    pub fn track<E: std::fmt::Display>(&mut self, what: &str, outcome: Result<(), E>) {
        match outcome {
            Ok(()) => self.passed(what),
            Err(error) => self.failed(what, &error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_starts_with_the_first_failure_and_ends_with_the_next_success() {
        let mut outage = Outage::default();
        outage.passed("renew");
        assert!(!outage.failing);
        outage.failed("renew", "down");
        outage.failed("renew", "still down");
        assert!(outage.failing);
        outage.passed("renew");
        assert!(!outage.failing);
    }
}
