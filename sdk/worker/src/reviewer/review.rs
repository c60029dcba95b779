//! What the reviewer finds in a file: its size and the notes a reviewer
//! looks at first (TODO and FIXME markers, long lines, trailing spaces).

use std::fmt::Write as _;

/// Lines longer than this are reported.
pub(super) const LONG_LINE: usize = 100;

/// The review of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FileReview {
    pub(super) name: String,
    pub(super) lines: usize,
    pub(super) words: usize,
    /// 1-based lines with `TODO` or `FIXME`.
    pub(super) markers: Vec<usize>,
    pub(super) long_lines: usize,
    pub(super) trailing_spaces: usize,
}

/// Reviews `text`, named `name`.
pub(super) fn review(name: &str, text: &str) -> FileReview {
    let mut review = FileReview {
        name: name.to_owned(),
        lines: 0,
        words: text.split_whitespace().count(),
        markers: Vec::new(),
        long_lines: 0,
        trailing_spaces: 0,
    };
    for (index, line) in text.lines().enumerate() {
        review.lines += 1;
        if line.contains("TODO") || line.contains("FIXME") {
            review.markers.push(index + 1);
        }
        if line.chars().count() > LONG_LINE {
            review.long_lines += 1;
        }
        if line.ends_with(' ') || line.ends_with('\t') {
            review.trailing_spaces += 1;
        }
    }
    review
}

/// The review of every file as a Markdown table.
pub(super) fn table(reviews: &[FileReview]) -> String {
    let mut table = String::from("| file | lines | words | TODO/FIXME | long lines | trailing spaces |\n");
    table.push_str("|---|---|---|---|---|---|\n");
    for review in reviews {
        let markers = if review.markers.is_empty() {
            "none".to_owned()
        } else {
            let lines: Vec<String> = review.markers.iter().map(|line| format!("L{line}")).collect();
            lines.join(" ")
        };
        let _ = writeln!(
            table,
            "| {} | {} | {} | {markers} | {} | {} |",
            review.name, review.lines, review.words, review.long_lines, review.trailing_spaces
        );
    }
    table
}

/// One sentence that sums the reviews up.
pub(super) fn summary(reviews: &[FileReview]) -> String {
    let markers: usize = reviews.iter().map(|review| review.markers.len()).sum();
    let lines: usize = reviews.iter().map(|review| review.lines).sum();
    let (files, lines) = (count(reviews.len(), "file"), count(lines, "line"));
    let notes = match markers {
        0 => "no TODO or FIXME".to_owned(),
        1 => "1 TODO/FIXME".to_owned(),
        n => format!("{n} TODO/FIXMEs"),
    };
    format!("Reviewed {files} ({lines}): {notes}.")
}

/// The review as data for a workflow's next steps: the summary, and how
/// sure the reviewer is (less when TODO or FIXME markers remain).
pub(super) fn verdict(reviews: &[FileReview], summary: &str) -> chorus_proto::taskstore::Part {
    let clean = reviews.iter().all(|review| review.markers.is_empty());
    let confidence = if clean { 0.9 } else { 0.6 };
    let data = serde_json::json!({ "summary": summary, "confidence": confidence, "files": reviews.len() });
    let content = chorus_proto::taskstore::part::Content::Data(chorus_proto::json::value_from_json(data));
    chorus_proto::taskstore::Part { content: Some(content), ..Default::default() }
}

/// `1 line`, `2 lines`.
pub(super) fn count(n: usize, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_counts_what_a_reviewer_looks_at() {
        let long = "x".repeat(LONG_LINE + 1);
        let text = format!("fn main() {{\n    // TODO: handle errors \n{long}\n}}\n");
        let found = review("main.rs", &text);
        assert_eq!(found.lines, 4);
        assert_eq!(found.markers, vec![2]);
        assert_eq!(found.long_lines, 1);
        assert_eq!(found.trailing_spaces, 1);
        assert_eq!(summary(std::slice::from_ref(&found)), "Reviewed 1 file (4 lines): 1 TODO/FIXME.");
        assert!(table(&[found]).contains("| main.rs | 4 | 9 | L2 | 1 | 1 |"), "the table names the file's numbers");
    }
}
