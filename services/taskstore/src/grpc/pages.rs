//! A page of tasks cut to what fits in one answer.

use chorus_proto::taskstore as pb;
use chorus_runtime::grpc::fitting;

use super::convert;
use crate::domain::{PageToken, TaskPage};

/// The page's tasks on the wire, as many as fit in `budget` bytes (at least
/// one): a page cut short continues after its last task.
pub(super) fn fit_page(page: TaskPage, budget: usize) -> pb::ListTasksResponse {
    let afters: Vec<PageToken> = page.tasks.iter().map(|task| page.after(task)).collect();
    let mut tasks: Vec<pb::Task> = page.tasks.into_iter().map(convert::task_out).collect();
    let fit = fitting(tasks.iter().map(prost::Message::encoded_len), budget);
    let mut next_page_token = page.next_page_token;
    if fit < tasks.len() {
        tasks.truncate(fit);
        next_page_token = afters.into_iter().nth(fit - 1);
    }
    pb::ListTasksResponse {
        tasks,
        next_page_token: next_page_token.map(|token| token.to_string()).unwrap_or_default(),
        total_size: u32::try_from(page.total_size).unwrap_or(u32::MAX),
    }
}
