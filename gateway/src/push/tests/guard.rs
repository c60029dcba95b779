//! The SSRF guard: the address table, URL syntax, and the policy overrides.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use chorus_runtime::egress::classify;

use crate::push::{
    AddressKind::{self, *},
    PushError, PushPolicy, UrlGuard,
};

fn guard(allow_private: bool, allowed_hosts: &[&str]) -> UrlGuard {
    let allowed_hosts = allowed_hosts.iter().map(|host| (*host).to_owned()).collect();
    UrlGuard::new(&PushPolicy { allow_private, allowed_hosts, ..PushPolicy::default() })
}

/// Every refused IPv4 range, at its edges where the edge matters.
const BLOCKED_V4: &[(&str, AddressKind)] = &[
    ("127.0.0.1", Loopback),
    ("127.255.255.254", Loopback),
    ("0.0.0.0", Unspecified),
    ("0.1.2.3", Reserved),
    ("169.254.0.1", LinkLocal),
    ("169.254.255.255", LinkLocal),
    ("169.254.169.254", CloudMetadata),
    ("10.0.0.1", Private),
    ("10.255.255.255", Private),
    ("172.16.0.1", Private),
    ("172.31.255.255", Private),
    ("192.168.0.1", Private),
    ("192.168.255.255", Private),
    ("100.64.0.0", Shared),
    ("100.127.255.255", Shared),
    ("224.0.0.1", Multicast),
    ("239.255.255.250", Multicast),
    ("255.255.255.255", Broadcast),
    ("192.0.2.1", Documentation),
    ("198.51.100.7", Documentation),
    ("203.0.113.200", Documentation),
    ("192.0.0.8", Reserved),
    ("198.18.0.1", Reserved),
    ("198.19.255.255", Reserved),
    ("240.0.0.1", Reserved),
];

/// Public neighbours of the refused ranges.
const PUBLIC_V4: &[&str] = &[
    "8.8.8.8",
    "1.1.1.1",
    "9.255.255.255",
    "11.0.0.0",
    "100.63.255.255",
    "100.128.0.0",
    "172.15.255.255",
    "172.32.0.0",
    "169.253.255.255",
    "169.255.0.0",
    "192.167.255.255",
    "192.169.0.0",
    "198.17.255.255",
    "198.20.0.0",
    "223.255.255.255",
    "126.255.255.255",
    "128.0.0.0",
];

const BLOCKED_V6: &[(&str, AddressKind)] = &[
    ("::1", Loopback),
    ("::", Unspecified),
    ("::7f00:1", Reserved),
    ("fe80::1", LinkLocal),
    ("febf:ffff::1", LinkLocal),
    ("fc00::1", UniqueLocal),
    ("fd12:3456::1", UniqueLocal),
    ("fd00:ec2::254", UniqueLocal),
    ("fec0::1", Private),
    ("ff02::1", Multicast),
    ("ff0e::fb", Multicast),
    ("2001:db8::1", Documentation),
    ("3fff:fff::1", Documentation),
    ("100::1", Reserved),
    ("64:ff9b:1::a", Private),
    // NAT64 and 6to4 addresses are judged by the IPv4 address they embed.
    ("64:ff9b::7f00:1", Loopback),
    ("64:ff9b::a9fe:a9fe", CloudMetadata),
    ("2002:a00:1::1", Private),
    ("2002:7f00:1::", Loopback),
];

const PUBLIC_V6: &[&str] = &[
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "64:ff9b::808:808",
    "2002:808:808::1",
    "3fff:1000::1",
    "2001:db9::1",
    "fe00::1",
];

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap_or_else(|error| panic!("{text}: {error}"))
}

#[test]
fn classifies_every_refused_ipv4_range() {
    for &(addr, kind) in BLOCKED_V4 {
        assert_eq!(classify(ip(addr)), Some(kind), "{addr}");
    }
    for &addr in PUBLIC_V4 {
        assert_eq!(classify(ip(addr)), None, "{addr}");
    }
}

#[test]
fn classifies_every_refused_ipv6_range() {
    for &(addr, kind) in BLOCKED_V6 {
        assert_eq!(classify(ip(addr)), Some(kind), "{addr}");
    }
    for &addr in PUBLIC_V6 {
        assert_eq!(classify(ip(addr)), None, "{addr}");
    }
}

#[test]
fn judges_ipv4_mapped_ipv6_by_the_ipv4_address() {
    for &(addr, kind) in BLOCKED_V4 {
        let v4: Ipv4Addr = addr.parse().expect("v4");
        let mapped = IpAddr::V6(v4.to_ipv6_mapped());
        assert_eq!(classify(mapped), Some(kind), "{mapped}");
    }
    for &addr in PUBLIC_V4 {
        let v4: Ipv4Addr = addr.parse().expect("v4");
        assert_eq!(classify(IpAddr::V6(v4.to_ipv6_mapped())), None, "{addr}");
    }
}

#[tokio::test]
async fn refuses_literal_hosts_with_a_clear_message() {
    let guard = guard(false, &[]);
    let error = guard.resolve("http://127.0.0.1:8080/hook").await.expect_err("loopback refused");
    assert_eq!(
        error.to_string(),
        "push URL host 127.0.0.1 is a loopback address; set gateway.push.allow_private to allow it"
    );
    let cases = [
        ("http://[::1]/", "::1", Loopback),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254", CloudMetadata),
        ("https://[::ffff:169.254.169.254]/", "::ffff:169.254.169.254", CloudMetadata),
        ("https://[::ffff:10.1.2.3]:8443/", "::ffff:10.1.2.3", Private),
        ("http://[fd00::5]/", "fd00::5", UniqueLocal),
        // The URL parser reads these host spellings as 127.0.0.1.
        ("http://2130706433/", "127.0.0.1", Loopback),
        ("http://0x7f.1/", "127.0.0.1", Loopback),
    ];
    for (url, addr, kind) in cases {
        match guard.resolve(url).await {
            Err(PushError::Blocked { addr: got, kind: got_kind, .. }) => {
                assert_eq!((got, got_kind), (ip(addr), kind), "{url}");
            }
            other => panic!("{url}: expected a refusal, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn refuses_names_that_resolve_to_refused_addresses() {
    let error = guard(false, &[]).resolve("http://localhost:9/").await.expect_err("localhost refused");
    let PushError::Blocked { host, kind, .. } = &error else { panic!("expected a refusal, got {error:?}") };
    assert_eq!((host.as_str(), *kind), ("localhost", Loopback));
    let message = error.to_string();
    assert!(message.starts_with("push URL host localhost resolves to "), "{message}");
    assert!(message.contains("gateway.push.allowed_hosts"), "{message}");
}

#[tokio::test]
async fn resolves_public_literals_with_the_scheme_port() {
    let guard = guard(false, &[]);
    let addrs = guard.resolve("https://8.8.8.8/hook").await.expect("public address");
    assert_eq!(addrs, [SocketAddr::new(ip("8.8.8.8"), 443)]);
    let addrs = guard.resolve("http://[2606:4700:4700::1111]:8080/").await.expect("public address");
    assert_eq!(addrs, [SocketAddr::new(ip("2606:4700:4700::1111"), 8080)]);
}

#[tokio::test]
async fn allow_private_admits_every_address() {
    let guard = guard(true, &[]);
    let addrs = guard.resolve("http://127.0.0.1:8080/").await.expect("allowed");
    assert_eq!(addrs, [SocketAddr::new(ip("127.0.0.1"), 8080)]);
    guard.resolve("http://169.254.169.254/").await.expect("allowed");
    guard.resolve("http://localhost:9/").await.expect("allowed");
}

#[tokio::test]
async fn allowed_hosts_exempt_exactly_the_listed_hosts() {
    let guard = guard(false, &["LocalHost", "[::1]", "::FFFF:7F00:2"]);
    let addrs = guard.resolve("http://localhost:9/").await.expect("listed name");
    assert!(addrs.iter().all(|addr| addr.ip().is_loopback() && addr.port() == 9), "{addrs:?}");
    guard.resolve("http://LOCALHOST:9/").await.expect("case-insensitive");
    guard.resolve("http://[::1]/").await.expect("listed IPv6 literal");
    guard.resolve("http://[::ffff:127.0.0.2]/").await.expect("listed mapped literal, other spelling");
    let error = guard.resolve("http://127.0.0.1/").await.expect_err("not listed");
    assert!(matches!(error, PushError::Blocked { kind: Loopback, .. }), "{error:?}");
}

#[test]
fn check_accepts_http_and_https() {
    let guard = guard(false, &[]);
    let url = guard.check("https://hooks.example.com/a2a?task=1").expect("https");
    assert_eq!(url.host_str(), Some("hooks.example.com"));
    guard.check("http://hooks.example.com:8080/").expect("http");
    guard.check("HTTP://Hooks.Example.COM/").expect("scheme case");
}

#[test]
fn check_refuses_other_schemes() {
    let guard = guard(false, &[]);
    for url in ["ftp://example.com/", "file:///etc/passwd", "gopher://example.com/", "javascript:alert(1)", "ws://a/"] {
        match guard.check(url) {
            Err(PushError::UnsupportedScheme(_)) => {}
            other => panic!("{url}: expected UnsupportedScheme, got {other:?}"),
        }
    }
    let error = guard.check("ftp://example.com/").expect_err("ftp");
    assert_eq!(error.to_string(), "push URL scheme ftp is not supported; use http or https");
}

#[test]
fn check_refuses_userinfo() {
    let guard = guard(false, &[]);
    for url in ["http://user:secret@example.com/", "http://user@example.com/", "https://:secret@example.com/"] {
        let error = guard.check(url).expect_err(url);
        assert!(matches!(error, PushError::UserInfo), "{url}: {error:?}");
        assert!(!error.to_string().contains("secret"), "{error}");
    }
}

#[test]
fn check_refuses_missing_hosts_and_garbage() {
    let guard = guard(false, &[]);
    for url in ["http://", "https://:443/", "http://@/"] {
        let error = guard.check(url).expect_err(url);
        assert!(matches!(error, PushError::MissingHost), "{url}: {error:?}");
    }
    for url in ["", "not a url", "/relative/path", "http://exa mple.com/", "http://[::1/"] {
        let error = guard.check(url).expect_err(url);
        assert!(matches!(error, PushError::InvalidUrl(_)), "{url}: {error:?}");
    }
}
