//! The A2A task state machine.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Submitted,
    Working,
    InputRequired,
    AuthRequired,
    Completed,
    Failed,
    Canceled,
    Rejected,
}

impl TaskState {
    pub const ALL: [Self; 8] = [
        Self::Submitted,
        Self::Working,
        Self::InputRequired,
        Self::AuthRequired,
        Self::Completed,
        Self::Failed,
        Self::Canceled,
        Self::Rejected,
    ];

    /// No transition leaves a terminal state.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Canceled | Self::Rejected)
    }

    /// The task waits for someone outside the agent.
    pub fn is_interrupted(self) -> bool {
        matches!(self, Self::InputRequired | Self::AuthRequired)
    }

    /// Whether `self → next` is a legal A2A transition. `working → working`
    /// is allowed: it is how an agent reports progress. An agent may reject
    /// a task it is already working on, or waiting on: A2A lets it decide
    /// "later" that it can't or won't proceed.
    pub fn can_become(self, next: Self) -> bool {
        use TaskState::*;
        match self {
            Submitted => {
                matches!(next, Working | InputRequired | AuthRequired | Completed | Failed | Canceled | Rejected)
            }
            Working => {
                matches!(next, Working | InputRequired | AuthRequired | Completed | Failed | Canceled | Rejected)
            }
            InputRequired | AuthRequired => matches!(next, Working | Completed | Failed | Canceled | Rejected),
            Completed | Failed | Canceled | Rejected => false,
        }
    }

    /// The stable name used in storage and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Working => "working",
            Self::InputRequired => "input-required",
            Self::AuthRequired => "auth-required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::Rejected => "rejected",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == value)
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::TaskState::{self, *};

    #[test]
    fn terminal_states_are_final() {
        for from in [Completed, Failed, Canceled, Rejected] {
            for to in TaskState::ALL {
                assert!(!from.can_become(to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn the_happy_path_and_interruptions_are_legal() {
        assert!(Submitted.can_become(Working));
        assert!(Working.can_become(InputRequired));
        assert!(InputRequired.can_become(Working));
        assert!(Working.can_become(Completed));
        assert!(Submitted.can_become(Rejected));
    }

    #[test]
    fn an_agent_may_reject_a_task_it_is_working_on_or_waiting_on() {
        for from in [Working, InputRequired, AuthRequired] {
            assert!(from.can_become(Rejected), "{from} -> rejected");
        }
    }

    #[test]
    fn some_moves_are_not() {
        assert!(!Working.can_become(Submitted));
        assert!(!InputRequired.can_become(Submitted));
        assert!(!InputRequired.can_become(InputRequired));
    }

    #[test]
    fn names_round_trip() {
        for state in TaskState::ALL {
            assert_eq!(TaskState::parse(state.as_str()), Some(state));
        }
    }
}
