//! Tests of the push module: the guard's address table and URL checks, and
//! delivery against a real webhook receiver on `127.0.0.1:0`.

mod guard;
mod sender;

use super::PushPolicy;

#[test]
fn policy_defaults_and_rejects_unknown_fields() {
    let policy: PushPolicy = serde_json::from_str("{}").expect("empty policy");
    assert_eq!(policy, PushPolicy::default());
    assert!(!policy.allow_private);
    assert_eq!((policy.timeout_ms, policy.max_attempts), (10_000, 5));
    assert_eq!((policy.initial_backoff_ms, policy.max_backoff_ms), (500, 30_000));

    let policy: PushPolicy = serde_json::from_str(r#"{"allow_private": true}"#).expect("partial policy");
    assert!(policy.allow_private);
    assert_eq!(policy.max_attempts, 5);

    let error = serde_json::from_str::<PushPolicy>(r#"{"allow_privat": true}"#).expect_err("typo refused");
    assert!(error.to_string().contains("unknown field `allow_privat`"), "{error}");
}
