//! Which addresses outbound HTTP may reach: the address table behind the
//! SSRF guards of the gateway's push notifications and delegations and the
//! workflow engine's webhooks ([`EgressGuard`] for the last two). A URL from
//! a client, a card or a definition is untrusted; its host must not be, or
//! resolve to, an address of this machine, its networks or its cloud's
//! metadata service unless the operator allows it.

mod guard;

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

pub use guard::{EgressGuard, Refused, bare_host, normalize_host, refusal};

/// Reads and drops the body of an answer whose status was all the caller
/// wanted, up to 64 KiB and for at most a second, so that its connection
/// can serve the next call: a connection whose answer was left unread is
/// closed, and the next call to the same host opens another.
pub async fn drain(response: reqwest::Response) {
    drain_stream(response.bytes_stream(), 64 * 1024, std::time::Duration::from_secs(1)).await;
}

/// Reads and drops what is left of a body, up to about `most` bytes and for
/// at most `within`; a body that breaks ends it early.
pub async fn drain_stream<B: AsRef<[u8]>, E>(
    chunks: impl futures_util::Stream<Item = Result<B, E>> + Unpin,
    most: usize,
    within: std::time::Duration,
) {
    use futures_util::StreamExt as _;
    let mut chunks = chunks;
    let read_all = async move {
        let mut read = 0;
        while read <= most
            && let Some(Ok(chunk)) = chunks.next().await
        {
            read += chunk.as_ref().len();
        }
    };
    tokio::time::timeout(within, read_all).await.ok();
}

/// The AWS, GCP and Azure instance metadata address.
const METADATA_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

/// Why an address may not be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressKind {
    Loopback,
    Unspecified,
    LinkLocal,
    CloudMetadata,
    Private,
    Shared,
    UniqueLocal,
    Multicast,
    Broadcast,
    Documentation,
    Reserved,
}

impl fmt::Display for AddressKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Loopback => "a loopback address",
            Self::Unspecified => "an unspecified address",
            Self::LinkLocal => "a link-local address",
            Self::CloudMetadata => "the cloud metadata address",
            Self::Private => "a private address",
            Self::Shared => "a shared (carrier-grade NAT) address",
            Self::UniqueLocal => "a unique-local address",
            Self::Multicast => "a multicast address",
            Self::Broadcast => "the broadcast address",
            Self::Documentation => "a documentation address",
            Self::Reserved => "a reserved address",
        })
    }
}

/// The kind of a non-public address, `None` for a public one. IPv6
/// addresses that embed an IPv4 address (mapped, NAT64 well-known prefix,
/// 6to4) are judged by the embedded address.
pub fn classify(ip: IpAddr) -> Option<AddressKind> {
    match ip {
        IpAddr::V4(ip) => classify_v4(ip),
        IpAddr::V6(ip) => classify_v6(ip),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressKind> {
    let [a, b, c, _] = ip.octets();
    let kind = if ip == METADATA_V4 {
        AddressKind::CloudMetadata
    } else if ip.is_unspecified() {
        AddressKind::Unspecified
    } else if ip.is_loopback() {
        AddressKind::Loopback
    } else if ip.is_private() {
        AddressKind::Private
    } else if ip.is_link_local() {
        AddressKind::LinkLocal
    } else if a == 100 && (b & 0xc0) == 64 {
        AddressKind::Shared
    } else if ip.is_broadcast() {
        AddressKind::Broadcast
    } else if ip.is_multicast() {
        AddressKind::Multicast
    } else if ip.is_documentation() {
        AddressKind::Documentation
    } else if a == 0 || a >= 240 || (a, b, c) == (192, 0, 0) || (a == 198 && (b & 0xfe) == 18) {
        // "This network" 0/8, future use 240/4, IETF protocol assignments
        // 192.0.0/24, benchmarking 198.18/15.
        AddressKind::Reserved
    } else {
        return None;
    };
    Some(kind)
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressKind> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    let s = ip.segments();
    let embedded = |high: u16, low: u16| Ipv4Addr::from((u32::from(high) << 16) | u32::from(low));
    let kind = if ip.is_unspecified() {
        AddressKind::Unspecified
    } else if ip.is_loopback() {
        AddressKind::Loopback
    } else if s[..6] == [0; 6] {
        // Deprecated IPv4-compatible ::a.b.c.d.
        AddressKind::Reserved
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return classify_v4(embedded(s[6], s[7]));
    } else if s[0] == 0x2002 {
        return classify_v4(embedded(s[1], s[2]));
    } else if s[..3] == [0x64, 0xff9b, 1] {
        // Local-use NAT64 prefix 64:ff9b:1::/48.
        AddressKind::Private
    } else if ip.is_unicast_link_local() {
        AddressKind::LinkLocal
    } else if (s[0] & 0xffc0) == 0xfec0 {
        // Deprecated site-local fec0::/10.
        AddressKind::Private
    } else if ip.is_unique_local() {
        AddressKind::UniqueLocal
    } else if ip.is_multicast() {
        AddressKind::Multicast
    } else if s[..2] == [0x2001, 0x0db8] || (s[0] == 0x3fff && (s[1] & 0xf000) == 0) {
        AddressKind::Documentation
    } else if s[..4] == [0x0100, 0, 0, 0] {
        // Discard-only 100::/64.
        AddressKind::Reserved
    } else {
        return None;
    };
    Some(kind)
}
