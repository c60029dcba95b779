//! Discovery: registration, heartbeats, staleness, filters and modes.

use std::time::Duration;

use chorus_hub::{
    domain::{AgentQuery, AgentStatus, DiscoveryMode, InboxFilter},
    error::HubError,
    service::DISCOVERY_TOPIC,
};

use crate::harness::{Harness, NS, conformance, test_config};

conformance!(
    discover_filters_by_capability_type_and_status,
    silent_agents_go_stale_and_heartbeats_revive_them,
    static_and_broadcast_modes,
    a_listener_with_a_full_inbox_does_not_fail_announcing_agents,
    deregistering_drops_subscriptions_and_queued_messages,
    discovery_stays_in_its_namespace,
);

fn query(capabilities: &[&str], agent_type: Option<&str>, status: Option<AgentStatus>) -> AgentQuery {
    AgentQuery {
        namespace: NS.into(),
        capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
        agent_type: agent_type.map(str::to_owned),
        status,
        stale_after: test_config().stale_after(),
        mode: DiscoveryMode::Registry,
    }
}

/// A query whose agents cannot go stale while a test runs, however slow the machine.
fn patient(capabilities: &[&str], agent_type: Option<&str>, status: Option<AgentStatus>) -> AgentQuery {
    AgentQuery { stale_after: Duration::from_secs(600), ..query(capabilities, agent_type, status) }
}

fn ids(agents: Vec<chorus_hub::domain::Agent>) -> Vec<String> {
    agents.into_iter().map(|agent| agent.id).collect()
}

async fn discover_filters_by_capability_type_and_status(h: Harness) {
    h.agent_in(NS, "coder", "worker", &["rust", "review"]).await;
    h.agent_in(NS, "writer", "worker", &["docs"]).await;
    h.agent_in(NS, "boss", "coordinator", &["review"]).await;
    assert_eq!(ids(h.hub.discover(&patient(&["review"], None, None)).await.unwrap()), ["boss", "coder"]);
    assert_eq!(ids(h.hub.discover(&patient(&["review", "rust"], None, None)).await.unwrap()), ["coder"]);
    assert_eq!(ids(h.hub.discover(&patient(&[], Some("worker"), None)).await.unwrap()), ["coder", "writer"]);
    assert_eq!(h.hub.discover(&patient(&[], None, Some(AgentStatus::Active))).await.unwrap().len(), 3);
    // Registering again updates and keeps the first registration time.
    let first = h.hub.get_agent(NS, "coder").await.unwrap();
    let updated = h.agent_in(NS, "coder", "worker", &["go"]).await;
    assert_eq!((updated.registered_at, updated.capabilities.as_slice()), (first.registered_at, &["go".to_owned()][..]));
}

/// Staleness is judged by the query's window, which here reaches just past
/// chatty's heartbeat: a slow machine lengthens the window with it, and
/// quiet, silent a second longer, stays outside.
async fn silent_agents_go_stale_and_heartbeats_revive_them(h: Harness) {
    h.agent("quiet", "worker").await;
    h.agent("chatty", "worker").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Taken before the heartbeat: chatty was heard at or after it.
    let heard = tokio::time::Instant::now();
    h.hub.heartbeat(NS, "chatty").await.unwrap();
    let since_heard = |status| AgentQuery {
        stale_after: heard.elapsed() + Duration::from_millis(300),
        ..query(&[], None, Some(status))
    };
    assert_eq!(ids(h.hub.discover(&since_heard(AgentStatus::Active)).await.unwrap()), ["chatty"]);
    assert_eq!(ids(h.hub.discover(&since_heard(AgentStatus::Stale)).await.unwrap()), ["quiet"]);
    h.hub.heartbeat(NS, "quiet").await.unwrap();
    assert_eq!(h.hub.discover(&since_heard(AgentStatus::Active)).await.unwrap().len(), 2);
    let error = h.hub.heartbeat(NS, "ghost").await.unwrap_err();
    assert!(matches!(error, HubError::AgentNotFound(_)), "{error}");
}

async fn static_and_broadcast_modes(h: Harness) {
    h.agent("listener", "worker").await;
    h.hub.subscribe(NS, "listener", DISCOVERY_TOPIC).await.unwrap();
    let mut loud = h.agent("plain", "worker").await;
    loud.id = "loud".into();
    loud.announce = true;
    h.hub.register_agent(loud).await.unwrap();

    let mut by_mode = query(&[], None, None);
    by_mode.mode = DiscoveryMode::Static;
    assert_eq!(ids(h.hub.discover(&by_mode).await.unwrap()), ["oracle"], "configured, not registered");
    by_mode.mode = DiscoveryMode::Broadcast;
    assert_eq!(ids(h.hub.discover(&by_mode).await.unwrap()), ["loud"]);
    h.hub.heartbeat(NS, "loud").await.unwrap();
    let announcements = h.receive("listener", InboxFilter::default(), false, Duration::ZERO).await.messages;
    assert_eq!(announcements.len(), 2, "one at registration, one per heartbeat");
    assert!(announcements.iter().all(|m| m.sender == "loud" && m.content.message_type == "agent.announced"));
    let card: serde_json::Value = serde_json::from_slice(&announcements[0].content.payload).unwrap();
    assert_eq!(card["id"], "loud");
}

async fn a_listener_with_a_full_inbox_does_not_fail_announcing_agents(h: Harness) {
    h.agent("listener", "worker").await;
    h.hub.subscribe(NS, "listener", DISCOVERY_TOPIC).await.unwrap();
    let mut loud = h.agent("loud", "worker").await;
    loud.announce = true;
    h.hub.register_agent(loud.clone()).await.unwrap();
    // The listener never reads: its inbox fills (max_queue_depth 5).
    for _ in 0..test_config().max_queue_depth {
        h.hub.heartbeat(NS, "loud").await.unwrap();
    }
    let before = h.hub.get_agent(NS, "loud").await.unwrap().last_seen_at;
    let heard = h.hub.heartbeat(NS, "loud").await.expect("a heartbeat is not refused for a listener's full inbox");
    assert!(heard.last_seen_at > before);
    let mut newcomer = loud;
    newcomer.id = "newcomer".into();
    h.hub.register_agent(newcomer).await.expect("nor is a registration");
    let queued = h.receive("listener", InboxFilter::default(), false, Duration::ZERO).await.messages;
    assert_eq!(queued.len(), test_config().max_queue_depth as usize, "the inbox holds what fitted");
}

async fn deregistering_drops_subscriptions_and_queued_messages(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    h.hub.subscribe(NS, "b", "t").await.unwrap();
    h.direct("a", "b", "pending").await;
    h.hub.deregister_agent(NS, "b").await.unwrap();
    assert!(matches!(h.hub.get_agent(NS, "b").await.unwrap_err(), HubError::AgentNotFound(_)));
    assert!(h.hub.subscriptions(NS, None, Some("t")).await.unwrap().is_empty());
    h.agent("b", "worker").await;
    assert!(h.drain("b").await.is_empty(), "a new registration starts with an empty inbox");
    let error = h.hub.deregister_agent(NS, "ghost").await.unwrap_err();
    assert!(matches!(error, HubError::AgentNotFound(_)), "{error}");
}

async fn discovery_stays_in_its_namespace(h: Harness) {
    h.agent_in("other", "spy", "worker", &["review"]).await;
    assert!(h.hub.discover(&query(&[], None, None)).await.unwrap().is_empty());
    assert!(matches!(h.hub.get_agent(NS, "spy").await.unwrap_err(), HubError::AgentNotFound(_)));
    let mut theirs = query(&[], None, None);
    theirs.namespace = "other".into();
    assert_eq!(ids(h.hub.discover(&theirs).await.unwrap()), ["spy"]);
}
