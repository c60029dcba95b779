//! grpc-web calls as a page makes them: one framed message in the body of an
//! HTTP POST, with the page's headers.

use reqwest::Response;

use crate::a2a::A2a;

/// A binary grpc-web call of `path` (`/chorus.taskstore.v1.TaskStore/ListTasks`)
/// with `message`, sending `headers` beside grpc-web's own.
pub async fn call(a2a: &A2a, path: &str, message: &impl prost::Message, headers: &[(&str, &str)]) -> Response {
    let bytes = message.encode_to_vec();
    let mut body = vec![0];
    body.extend_from_slice(&u32::try_from(bytes.len()).expect("a small message").to_be_bytes());
    body.extend_from_slice(&bytes);
    let mut request = a2a
        .http()
        .post(format!("{}{path}", a2a.base()))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("a grpc-web call")
}
