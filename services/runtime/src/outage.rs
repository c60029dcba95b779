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
    pub fn failed(&mut self, what: &str, error: &str) {
        if std::mem::replace(&mut self.failing, true) {
            tracing::debug!(error, "{what} still fails");
        } else {
            tracing::warn!(error, "{what} fails; trying again, and saying so once it works");
        }
    }

    /// `what` worked: the end of an outage is said.
    pub fn passed(&mut self, what: &str) {
        if std::mem::take(&mut self.failing) {
            tracing::info!("{what} works again");
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
