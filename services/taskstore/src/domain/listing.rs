//! Task listings: their filters, pages and page tokens.

use std::{fmt, str::FromStr};

use super::{Task, TaskState};

/// Filters and paging of a task listing.
#[derive(Debug, Clone)]
pub struct TaskQuery {
    pub namespace: String,
    pub context_id: Option<String>,
    pub state: Option<TaskState>,
    pub agent_id: Option<String>,
    /// Only the children of this task.
    pub parent_id: Option<String>,
    /// Only tasks whose status changed at or after this time (µs).
    pub updated_after: Option<i64>,
    pub page_size: u32,
    pub page_token: Option<PageToken>,
    pub history_length: Option<u32>,
    pub include_artifacts: bool,
}

impl TaskQuery {
    /// A digest of the listing's filters (FNV-1a: the same in every build),
    /// which a page token's total is bound to.
    pub fn filters(&self) -> u64 {
        let state = self.state.map(TaskState::as_str).unwrap_or_default();
        let after = self.updated_after.map(|after| after.to_string()).unwrap_or_default();
        let fields = [
            self.namespace.as_str(),
            self.context_id.as_deref().unwrap_or_default(),
            state,
            self.agent_id.as_deref().unwrap_or_default(),
            &after,
            self.parent_id.as_deref().unwrap_or_default(),
        ];
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in fields.iter().flat_map(|field| field.bytes().chain([0xff])) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        hash
    }
}

/// Where the next page starts: after this (status timestamp, id). It also
/// carries the listing's total as the first page counted it, with the
/// filters it counted under: later pages of that listing do not count it
/// again. Written `total@filters!timestamp~id`; a token without a total
/// bound to the filters (`timestamp~id`, `total!timestamp~id`, as earlier
/// versions wrote them), or used with other filters, is counted again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageToken {
    pub timestamp: i64,
    pub id: String,
    pub counted: Option<Counted>,
}

/// A listing's total, and the digest of the filters it was counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub total: u64,
    pub filters: u64,
}

impl PageToken {
    /// The token of the page after `task`, in a listing of `total` tasks.
    pub fn after(task: &Task, counted: Counted) -> Self {
        Self { timestamp: task.status.timestamp, id: task.id.clone(), counted: Some(counted) }
    }

    /// The total it carries, if counted under `query`'s filters.
    pub fn total_for(&self, query: &TaskQuery) -> Option<u64> {
        self.counted.filter(|counted| counted.filters == query.filters()).map(|counted| counted.total)
    }
}

impl fmt::Display for PageToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(Counted { total, filters }) = self.counted {
            write!(f, "{total}@{filters:x}!")?;
        }
        write!(f, "{}~{}", self.timestamp, self.id)
    }
}

impl FromStr for PageToken {
    type Err = ();

    fn from_str(value: &str) -> Result<Self, ()> {
        let (head, id) = value.split_once('~').ok_or(())?;
        let (counted, timestamp) = match head.split_once('!') {
            Some((counted, timestamp)) => (Some(counted), timestamp),
            None => (None, head),
        };
        let counted = match counted.map(|counted| (counted, counted.split_once('@'))) {
            None => None,
            Some((_, Some((total, filters)))) => Some(Counted {
                total: total.parse().map_err(drop)?,
                filters: u64::from_str_radix(filters, 16).map_err(drop)?,
            }),
            // An earlier version's total, bound to no filters: counted again.
            Some((total, None)) => {
                total.parse::<u64>().map_err(drop)?;
                None
            }
        };
        let timestamp = timestamp.parse().map_err(drop)?;
        if id.is_empty() {
            return Err(());
        }
        Ok(Self { timestamp, id: id.to_owned(), counted })
    }
}

#[derive(Debug, Clone)]
pub struct TaskPage {
    pub tasks: Vec<Task>,
    pub next_page_token: Option<PageToken>,
    pub total_size: u64,
    /// The digest of the filters the total was counted under, which every
    /// page token after one of its tasks carries.
    pub filters: u64,
}

impl TaskPage {
    /// The token of the page after `task`, one of this page's.
    pub fn after(&self, task: &Task) -> PageToken {
        PageToken::after(task, Counted { total: self.total_size, filters: self.filters })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_tokens_total_holds_for_the_filters_it_was_counted_under() {
        let query = |context: &str| TaskQuery {
            namespace: "ns".into(),
            context_id: Some(context.into()),
            state: None,
            agent_id: None,
            parent_id: None,
            updated_after: None,
            page_size: 1,
            page_token: None,
            history_length: None,
            include_artifacts: false,
        };
        let counted = Counted { total: 4, filters: query("a").filters() };
        let token = PageToken { timestamp: 1, id: "t".into(), counted: Some(counted) };
        assert_eq!(token.total_for(&query("a")), Some(4));
        assert_eq!(token.total_for(&query("b")), None, "other filters count again");
        assert_ne!(query("ab").filters(), TaskQuery { namespace: "nsa".into(), ..query("b") }.filters());
    }
}
