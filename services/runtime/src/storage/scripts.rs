//! SQLite's transaction scripts: writes that must land whole, served by
//! the one writer in batches that share a transaction and a commit.

use std::sync::{Arc, LazyLock, OnceLock};

use futures_util::{FutureExt as _, TryStreamExt as _, future::BoxFuture};
use sqlx::{
    Any, AnyPool, Arguments as _, AssertSqlSafe, Either, Execute as _, Executor as _,
    any::{AnyArguments, AnyRow},
    query::Query,
};

use super::{
    Backend, Db,
    lane::{Lane, Unfinished},
};
use crate::batch::Batcher;

/// A script of writes that must land whole, for SQLite's writer: its
/// statements without a `BEGIN` or `COMMIT` of their own, `$1`… bound by the
/// caller ([`query`](Self::query)). [`Db::run_transaction_script`] runs it in
/// a transaction of its own, or, when other scripts wait with it, in one
/// transaction it shares with them, beside other requests for the same
/// script as one run of copies of it.
#[derive(Debug)]
pub struct TransactionScript {
    /// The script in a transaction of its own.
    alone: Arc<str>,
    /// Its statements, `$1`… numbered from 1.
    body: String,
    /// How many parameters it binds.
    parameters: usize,
    /// How many statements it runs.
    statements: usize,
    /// `runs[i]`: 2^i copies of the script under one savepoint, each copy's
    /// parameters numbered after the previous copy's; made when first needed.
    runs: [OnceLock<Arc<str>>; RUN_SIZES],
}

impl TransactionScript {
    pub fn new(body: &str) -> Self {
        let body = body.trim().trim_end_matches(';').trim_end();
        let mut statements = 1;
        let mut parameters = 0;
        scan(body, |token| match token {
            Token::Separator => statements += 1,
            Token::Parameter(number) => parameters = parameters.max(number),
            Token::Text(_) => {}
        });
        Self {
            alone: format!("BEGIN; {body}; COMMIT").into(),
            body: body.to_owned(),
            parameters,
            statements,
            runs: Default::default(),
        }
    }

    /// The script alone, for its parameters to be bound to.
    pub fn query(&self) -> Query<'static, Any, AnyArguments> {
        sqlx::query(AssertSqlSafe(Arc::clone(&self.alone)))
    }

    /// `2^size` copies of the script under one savepoint.
    fn run(&self, size: usize) -> Arc<str> {
        let sql = self.runs[size].get_or_init(|| {
            let mut sql = format!("SAVEPOINT {SAVEPOINT}");
            for copy in 0..1 << size {
                sql.push_str("; ");
                scan(&self.body, |token| match token {
                    Token::Text(text) => sql.push_str(text),
                    Token::Separator => sql.push(';'),
                    Token::Parameter(number) => sql.push_str(&format!("${}", number + copy * self.parameters)),
                });
            }
            sql.push_str(&format!("; RELEASE {SAVEPOINT}"));
            sql.into()
        });
        Arc::clone(sql)
    }
}

/// A piece of a script's text.
enum Token<'a> {
    /// Text to copy as it is (string literals, quoted names and comments whole).
    Text(&'a str),
    /// A `;` between statements.
    Separator,
    /// `$n`.
    Parameter(usize),
}

/// Splits SQL text into [`Token`]s, in order.
fn scan<'a>(sql: &'a str, mut token: impl FnMut(Token<'a>)) {
    let bytes = sql.as_bytes();
    let (mut at, mut text_from) = (0, 0);
    while at < bytes.len() {
        match bytes[at] {
            quote @ (b'\'' | b'"') => {
                // A quoted literal or name (a doubled quote inside it is two of these).
                at += 1;
                while at < bytes.len() && bytes[at] != quote {
                    at += 1;
                }
                at += 1;
            }
            b'-' if bytes.get(at + 1) == Some(&b'-') => {
                at += bytes[at..].iter().position(|&byte| byte == b'\n').unwrap_or(bytes.len() - at);
            }
            b'/' if bytes.get(at + 1) == Some(&b'*') => {
                at += sql[at + 2..].find("*/").map_or(bytes.len() - at, |end| end + 4);
            }
            b';' => {
                token(Token::Text(&sql[text_from..at]));
                token(Token::Separator);
                at += 1;
                text_from = at;
            }
            b'$' if bytes.get(at + 1).is_some_and(u8::is_ascii_digit) => {
                let digits = bytes[at + 1..].iter().take_while(|byte| byte.is_ascii_digit()).count();
                token(Token::Text(&sql[text_from..at]));
                token(Token::Parameter(sql[at + 1..at + 1 + digits].parse().expect("digits")));
                at += 1 + digits;
                text_from = at;
            }
            _ => at += 1,
        }
    }
    token(Token::Text(&sql[text_from.min(sql.len())..]));
}

/// The savepoint each run of a batch goes under.
const SAVEPOINT: &str = "chorus_script";

/// Undoes what a failed run of a batch wrote.
static UNDO_RUN: LazyLock<String> = LazyLock::new(|| format!("ROLLBACK TO {SAVEPOINT}; RELEASE {SAVEPOINT}"));

/// A script waiting for the writer, its parameters bound.
pub(super) type PendingScript = (&'static TransactionScript, Query<'static, Any, AnyArguments>);

/// The rows a script's statements returned, or why it wrote nothing.
pub(super) type ScriptAnswer = Result<Vec<AnyRow>, sqlx::Error>;

/// Scripts in one batch at most: the writer serves other work between
/// batches. A power of two, the longest run of copies of one script.
const BATCH: usize = 32;

/// The lengths a run may have: 1, 2, 4, … [`BATCH`] copies.
const RUN_SIZES: usize = BATCH.ilog2() as usize + 1;

/// Serves the scripts waiting for the writer at the same time in one
/// transaction, one commit for all, a batch at a time (there is one writer).
pub(super) fn script_batcher(pool: AnyPool, lane: Arc<Lane>) -> Batcher<PendingScript, ScriptAnswer> {
    lane_batcher(pool, lane, BATCH, 1, |connection, scripts| {
        async move {
            match <[PendingScript; 1]>::try_from(scripts) {
                Ok([(_, query)]) => vec![alone(connection, query).await],
                Err(scripts) => together(connection, scripts).await,
            }
        }
        .boxed()
    })
}

/// A batch of writes served on one of the lane's connections.
pub(super) type ServeOnLane<T> = fn(Unfinished, Vec<T>) -> BoxFuture<'static, Vec<ScriptAnswer>>;

/// Serves batches of at most `limit` writes, up to `in_flight` at once, each
/// with `serve` on a connection of the lane; a batch that gets no connection
/// fails whole.
pub(super) fn lane_batcher<T: Send + 'static>(
    pool: AnyPool,
    lane: Arc<Lane>,
    limit: usize,
    in_flight: usize,
    serve: ServeOnLane<T>,
) -> Batcher<T, ScriptAnswer> {
    Batcher::new(limit, in_flight, move |batch: Vec<T>| {
        let (pool, lane) = (pool.clone(), Arc::clone(&lane));
        async move {
            match lane.acquire(&pool).await {
                Ok(connection) => serve(Unfinished::new(connection), batch).await,
                Err(error) => each_failed(batch.len(), &error),
            }
        }
        .boxed()
    })
}

/// A lone script, in a transaction its own text begins and commits.
async fn alone(mut connection: Unfinished, query: Query<'static, Any, AnyArguments>) -> ScriptAnswer {
    let rows = query.fetch_all(&mut *connection).await?;
    connection.finish();
    Ok(rows)
}

/// Scripts in one transaction. The requests for one script go as runs of
/// its copies (32, 16, … 1 at a time), each run one round trip to the
/// writer's thread under a savepoint. A run that fails is undone and its
/// scripts are run one by one, so that one that fails is undone alone and
/// answered with its error; the rest commit together. When the transaction
/// itself fails, nothing is written and every script fails (as unavailable,
/// apart from one whose own error ended it).
async fn together(mut connection: Unfinished, scripts: Vec<PendingScript>) -> Vec<ScriptAnswer> {
    let count = scripts.len();
    if let Err(error) = sqlx::query("BEGIN").execute(&mut *connection).await {
        return each_failed(count, &error);
    }
    let mut answers: Vec<Option<ScriptAnswer>> = (0..count).map(|_| None).collect();
    for (script, requests) in runs(scripts, &mut answers) {
        if let Ok(rows) = run(&mut connection, script, &requests).await {
            for ((index, _), rows) in requests.into_iter().zip(rows) {
                answers[index] = Some(Ok(rows));
            }
            continue;
        }
        if let Err(error) = undo(&mut connection).await {
            return each_failed(count, &error);
        }
        for request in &requests {
            let index = request.0;
            let answer =
                run(&mut connection, script, std::slice::from_ref(request)).await.map(|mut rows| rows.remove(0));
            if answer.is_err()
                && let Err(error) = undo(&mut connection).await
            {
                let mut answers = each_failed(count, &error);
                answers[index] = answer;
                return answers;
            }
            answers[index] = Some(answer);
        }
    }
    match sqlx::query("COMMIT").execute(&mut *connection).await {
        Ok(_) => {
            connection.finish();
            answers.into_iter().map(|answer| answer.expect("every script was answered")).collect()
        }
        Err(error) => each_failed(count, &error),
    }
}

/// Requests for one script, each with its place in the batch and its parameters.
type Run = (&'static TransactionScript, Vec<(usize, AnyArguments)>);

/// The requests of a batch with their parameters, grouped by script into
/// runs of copies, each of a length in [`RUN_SIZES`]; a request whose
/// parameters cannot be taken (or are too few or too many) is answered here.
fn runs(scripts: Vec<PendingScript>, answers: &mut [Option<ScriptAnswer>]) -> Vec<Run> {
    let mut by_script: Vec<Run> = Vec::new();
    for (index, (script, mut query)) in scripts.into_iter().enumerate() {
        let arguments = match query.take_arguments() {
            Ok(arguments) => arguments.unwrap_or_default(),
            Err(error) => {
                answers[index] = Some(Err(sqlx::Error::Encode(error)));
                continue;
            }
        };
        if arguments.len() != script.parameters {
            let error = format!("the script takes {} parameters, not {}", script.parameters, arguments.len());
            answers[index] = Some(Err(sqlx::Error::Encode(error.into())));
            continue;
        }
        match by_script.iter_mut().find(|(other, _)| std::ptr::eq(*other, script)) {
            Some((_, requests)) => requests.push((index, arguments)),
            None => by_script.push((script, vec![(index, arguments)])),
        }
    }
    let mut runs = Vec::new();
    for (script, mut requests) in by_script {
        while !requests.is_empty() {
            let rest = requests.split_off(1 << requests.len().ilog2());
            runs.push((script, std::mem::replace(&mut requests, rest)));
        }
    }
    runs
}

/// Runs copies of `script`, one for each request's parameters (a count in
/// [`RUN_SIZES`]), in one round trip; the rows of each copy.
async fn run(
    connection: &mut Unfinished,
    script: &TransactionScript,
    requests: &[(usize, AnyArguments)],
) -> Result<Vec<Vec<AnyRow>>, sqlx::Error> {
    let copies = requests.len();
    let mut bound = AnyArguments::default();
    for (_, arguments) in requests {
        bound.values.0.extend(arguments.values.0.iter().cloned());
    }
    let query = sqlx::query_with(AssertSqlSafe(script.run(copies.ilog2() as usize)), bound);
    let results: Vec<_> = (&mut **connection).fetch_many(query).try_collect().await?;
    // Each statement ends with a result: the savepoint's, each copy's
    // statements', the release's.
    let mut ended = 0;
    let (mut rows, mut copy_rows) = (Vec::with_capacity(copies), Vec::new());
    for result in results {
        match result {
            Either::Right(row) => copy_rows.push(row),
            Either::Left(_) => {
                ended += 1;
                if ended > 1 && (ended - 1) % script.statements == 0 && rows.len() < copies {
                    rows.push(std::mem::take(&mut copy_rows));
                }
            }
        }
    }
    if ended != copies * script.statements + 2 {
        return Err(sqlx::Error::Protocol(format!(
            "a run of {copies} copies of a script of {} statements ended {ended} statements",
            script.statements
        )));
    }
    Ok(rows)
}

/// Undoes what the run under the savepoint wrote; an error means the
/// transaction itself is lost.
async fn undo(connection: &mut Unfinished) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(UNDO_RUN.as_str())).execute(&mut **connection).await.map(drop)
}

/// An answer for each of `count` scripts their batch could not write:
/// unavailable, as each may land when tried again.
pub(super) fn each_failed(count: usize, error: &sqlx::Error) -> Vec<ScriptAnswer> {
    (0..count)
        .map(|_| Err(sqlx::Error::Io(std::io::Error::other(format!("the writes were not committed: {error}")))))
        .collect()
}

impl Db {
    /// Runs a SQLite script that must land whole, its parameters bound to
    /// `query` (made by [`TransactionScript::query`]); the rows its
    /// statements returned. Scripts that wait for the writer at the same time
    /// go in one transaction with one commit, where each would have taken
    /// the writer's turn, a round trip to its thread and a commit of its own
    /// (group commit); each is answered once its batch committed. A caller
    /// that goes away does not stop its script: it lands, or fails, whole.
    pub async fn run_transaction_script(
        &self,
        script: &'static TransactionScript,
        query: Query<'static, Any, AnyArguments>,
    ) -> ScriptAnswer {
        debug_assert_eq!(self.backend, Backend::Sqlite, "PostgreSQL runs one statement per round trip");
        self.scripts.call((script, query)).await.unwrap_or(Err(sqlx::Error::PoolClosed))
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::LazyLock, time::Duration};

    use super::TransactionScript;
    use crate::{
        storage::{
            Db,
            demo::{demo_db, demo_rows},
        },
        testing::given_up_after,
    };

    static TWO_ROWS: LazyLock<TransactionScript> = LazyLock::new(|| {
        TransactionScript::new(
            "INSERT INTO demo_rows (x) VALUES ($1); INSERT INTO demo_rows (x) VALUES ($2); \
             SELECT COUNT(*) AS n FROM demo_rows",
        )
    });

    async fn two_rows(db: &Db, a: i64, b: i64) -> Result<i64, sqlx::Error> {
        let rows = db.run_transaction_script(&TWO_ROWS, TWO_ROWS.query().bind(a).bind(b)).await?;
        Ok(sqlx::Row::get(rows.last().expect("the count"), "n"))
    }

    #[tokio::test]
    async fn a_transaction_script_commits_and_answers_with_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        assert_eq!(two_rows(&db, 1, 2).await.unwrap(), 2);
        assert_eq!(demo_rows(&db).await, [1, 2], "committed: a reader sees it");
    }

    #[tokio::test]
    async fn a_failing_transaction_script_writes_nothing_and_leaves_no_transaction_open() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        two_rows(&db, 1, 2).await.unwrap();
        // The second insert repeats a key: the script stops there, after its first insert.
        assert!(two_rows(&db, 3, 1).await.is_err());
        assert_eq!(demo_rows(&db).await, [1, 2], "the first insert was rolled back");
        assert_eq!(two_rows(&db, 4, 5).await.unwrap(), 4, "the next script runs in a transaction of its own");
        let mut tx = db.begin().await.expect("and a transaction handle can begin");
        sqlx::query("INSERT INTO demo_rows (x) VALUES (6)").execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(demo_rows(&db).await, [1, 2, 4, 5, 6]);
    }

    #[tokio::test]
    async fn scripts_waiting_together_commit_together_and_one_that_fails_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        // On this test's one thread the batcher runs only once all four wait:
        // they go to the writer as one batch, in order.
        let answers =
            futures_util::future::join_all([(1, 2), (3, 4), (5, 1), (6, 7)].map(|(a, b)| two_rows(&db, a, b)));
        let [first, second, repeating, last] = answers.await.try_into().expect("four answers");
        assert_eq!((first.unwrap(), second.unwrap()), (2, 4), "each sees the writes of those before it");
        assert!(repeating.is_err(), "the third repeats a key");
        assert_eq!(last.unwrap(), 6, "the fourth runs after the third's writes were undone");
        assert_eq!(demo_rows(&db).await, [1, 2, 3, 4, 6, 7], "committed, without the failed script's first insert");
    }

    /// Inserts $1, then answers with the rows from $2 up: none, one or many.
    static ROWS_FROM: LazyLock<TransactionScript> = LazyLock::new(|| {
        TransactionScript::new(
            "INSERT INTO demo_rows (x) VALUES ($1); SELECT x FROM demo_rows WHERE x >= $2 ORDER BY x;",
        )
    });

    async fn rows_from(db: &Db, insert: i64, from: i64) -> Result<Vec<i64>, sqlx::Error> {
        let rows = db.run_transaction_script(&ROWS_FROM, ROWS_FROM.query().bind(insert).bind(from)).await?;
        rows.iter().map(|row| sqlx::Row::try_get(row, "x")).collect()
    }

    #[tokio::test]
    async fn each_script_of_a_mixed_batch_is_answered_with_its_own_rows() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        // One batch: two_rows five times (a run of 4 and one of 1), then
        // rows_from three times (2 and 1), in the order sent within each.
        let pairs = futures_util::future::join_all((0..5).map(|i| two_rows(&db, 10 * i, 10 * i + 1)));
        let from =
            futures_util::future::join_all([(100, 1000), (101, 100), (5, 0)].map(|(x, from)| rows_from(&db, x, from)));
        let (pairs, from) = tokio::join!(pairs, from);
        let counts: Vec<i64> = pairs.into_iter().map(Result::unwrap).collect();
        assert_eq!(counts, [2, 4, 6, 8, 10]);
        let from: Vec<Vec<i64>> = from.into_iter().map(Result::unwrap).collect();
        assert_eq!(from, [vec![], vec![100, 101], vec![0, 1, 5, 10, 11, 20, 21, 30, 31, 40, 41, 100, 101]]);
    }

    #[test]
    fn a_run_of_copies_numbers_each_copys_parameters_after_the_last_and_leaves_quotes_and_comments_alone() {
        let script = TransactionScript::new("SELECT '$1;' || \"a;$2\" || $2 -- $3;\n; /* $4; */ SELECT $1 ;");
        assert_eq!((script.parameters, script.statements), (2, 2));
        assert_eq!(
            &*script.run(1),
            "SAVEPOINT chorus_script; SELECT '$1;' || \"a;$2\" || $2 -- $3;\n; /* $4; */ SELECT $1; \
             SELECT '$1;' || \"a;$2\" || $4 -- $3;\n; /* $4; */ SELECT $3; RELEASE chorus_script"
        );
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transaction_script_given_up_still_lands_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        for waits in 0..12_i64 {
            given_up_after(two_rows(&db, waits * 10, waits * 10 + 1), waits as usize).await;
            let rows =
                tokio::time::timeout(Duration::from_secs(10), demo_rows(&db)).await.expect("no write waits forever");
            let halves = (rows.contains(&(waits * 10)), rows.contains(&(waits * 10 + 1)));
            assert!(halves == (true, true) || halves == (false, false), "given up after {waits} waits: {rows:?}");
        }
        two_rows(&db, 1000, 1001).await.expect("the writer still runs whole scripts");
        let landed: Vec<i64> = (0..12).flat_map(|waits| [waits * 10, waits * 10 + 1]).chain([1000, 1001]).collect();
        assert_eq!(demo_rows(&db).await, landed, "every script landed whole, in the order sent");
    }
}
