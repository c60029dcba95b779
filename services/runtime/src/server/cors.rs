//! Which web pages may call the server from a browser: the origins an
//! operator lists, checked at start-up, and the CORS answers they get.

use std::time::Duration;

use tower_http::cors::{AllowOrigin, CorsLayer};

/// The origins `configured` lists, each as a browser writes it in `Origin`
/// (`scheme://host[:port]`, lower case, without the scheme's default port),
/// or `*` alone for any; an entry no browser could send is an error that
/// says how to write it.
pub fn origins(configured: &[String]) -> Result<Vec<String>, String> {
    configured.iter().map(|entry| origin(entry.trim())).collect()
}

fn origin(entry: &str) -> Result<String, String> {
    if entry == "*" {
        return Ok(entry.to_owned());
    }
    let shape = "an origin is scheme://host[:port], or * alone for any";
    if entry.contains('*') {
        return Err(format!("{entry:?} is not an origin: {shape} (no wildcard within a name)"));
    }
    let url = url::Url::parse(entry).map_err(|error| format!("{entry:?} is not an origin ({error}): {shape}"))?;
    let origin = url.origin();
    if !origin.is_tuple() {
        return Err(format!("{entry:?} is not an origin: {shape}"));
    }
    let written = origin.ascii_serialization();
    let no_more = url.path() == "/" && url.query().is_none() && url.fragment().is_none();
    if no_more && entry.ends_with('/') {
        return Err(format!("{entry:?} ends with a path: write {written}, as browsers send it"));
    }
    if !no_more || !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{entry:?} is not an origin: {shape}, such as {written}"));
    }
    Ok(written)
}

/// CORS for the pages of `origins`: the headers grpc-web and A2A clients
/// send (and `extra`), and the gRPC trailers that grpc-web reads as headers.
pub(super) fn layer(origins: &[String], extra: Vec<http::HeaderName>) -> CorsLayer {
    let allow_origin = if origins.iter().any(|origin| origin == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|origin| http::HeaderValue::from_str(origin).ok()))
    };
    let header = http::HeaderName::from_static;
    let mut headers = vec![
        http::header::CONTENT_TYPE,
        http::header::AUTHORIZATION,
        header("x-grpc-web"),
        header("x-user-agent"),
        header("grpc-timeout"),
        header("a2a-version"),
        header("a2a-extensions"),
        header("x-api-key"),
        header("connect-protocol-version"),
    ];
    for name in extra {
        if !headers.contains(&name) {
            headers.push(name);
        }
    }
    CorsLayer::new()
        .allow_origin(allow_origin)
        .allow_methods([http::Method::POST, http::Method::GET, http::Method::DELETE, http::Method::OPTIONS])
        .allow_headers(headers)
        .allow_private_network(true)
        .expose_headers([header("grpc-status"), header("grpc-message"), header("grpc-status-details-bin")])
        .max_age(Duration::from_secs(3600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_written_as_browsers_send_them() {
        let listed = |entries: &[&str]| origins(&entries.iter().map(|entry| (*entry).to_owned()).collect::<Vec<_>>());
        let written = listed(&["https://app.example.com", "HTTP://LOCALHOST:8080", "https://a.example:443", "*"]);
        assert_eq!(written.unwrap(), ["https://app.example.com", "http://localhost:8080", "https://a.example", "*"]);
        for (entry, says) in [
            ("http://127.0.0.1:47210/", "write http://127.0.0.1:47210"),
            ("127.0.0.1:47211", "is not an origin"),
            ("https://*.example.com", "no wildcard"),
            ("https://app.example.com/dashboard", "such as https://app.example.com"),
            ("", "is not an origin"),
        ] {
            let error = listed(&[entry]).unwrap_err();
            assert!(error.contains(says), "{entry:?}: {error}");
        }
    }
}
