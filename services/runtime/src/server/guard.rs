//! The check of calls to chorus's own gRPC services on a public port. A
//! credential for every namespace lets a call in on its headers; one scoped
//! to some namespaces lets in only a call whose request names one of them,
//! read from the request itself: every namespaced request of chorus's
//! services names its namespace first (`string namespace = 1`), and takes a
//! single message (no method streams requests).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use axum::{
    body::Body,
    extract::{Request, State},
    middleware::Next,
    response::Response,
};
use prost::Message as _;

use super::{Caller, OWN_SERVICES};

/// A check of a call's credentials (its headers): `Err` is the call's answer.
pub type Guard = Arc<dyn Fn(&http::HeaderMap) -> Result<Admission, tonic::Status> + Send + Sync>;

/// Whether a call may act in the namespace its request names (`None`: its
/// method names none, and so acts across namespaces). `Err` is its answer.
pub type NamespaceCheck = Arc<dyn Fn(Option<&str>) -> Result<(), tonic::Status> + Send + Sync>;

/// What a [`Guard`] let a call in with.
pub struct Admission {
    /// The credential's name, when it has one.
    pub caller: Option<String>,
    /// `None`: any namespace. Else the call's namespace must pass this.
    pub namespaces: Option<NamespaceCheck>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let namespaces = if self.namespaces.is_some() { "scoped" } else { "every" };
        f.debug_struct("Admission").field("caller", &self.caller).field("namespaces", &namespaces).finish()
    }
}

/// The header of every gRPC message: a compression flag and the message's length.
const FRAME_HEADER: usize = 5;

/// A request of chorus's services as far as its namespace (prost skips the
/// other fields).
#[derive(Clone, PartialEq, prost::Message)]
struct Namespaced {
    #[prost(string, tag = "1")]
    namespace: String,
}

/// What the guard middleware needs.
#[derive(Clone)]
pub(crate) struct Gate {
    guard: Guard,
    /// Every method by path (`/package.Service/Method`): whether its request
    /// names its namespace first.
    methods: Arc<HashMap<String, bool>>,
    max_message_bytes: usize,
}

impl Gate {
    /// Guards the methods of the services in the encoded descriptor `sets`.
    pub(crate) fn new(guard: Guard, sets: &[&[u8]], max_message_bytes: usize) -> Self {
        Self { guard, methods: Arc::new(methods(sets)), max_message_bytes }
    }
}

/// Every method in `sets`: whether its request's field 1 is `string namespace`.
fn methods(sets: &[&[u8]]) -> HashMap<String, bool> {
    use prost_types::field_descriptor_proto::Type;
    let files: Vec<_> = sets
        .iter()
        .flat_map(|set| prost_types::FileDescriptorSet::decode(*set).expect("embedded descriptor sets are valid").file)
        .collect();
    let namespaced: HashSet<String> = files
        .iter()
        .flat_map(|file| file.message_type.iter().map(move |message| (file.package(), message)))
        .filter(|(_, message)| {
            message
                .field
                .iter()
                .any(|field| field.number() == 1 && field.name() == "namespace" && field.r#type() == Type::String)
        })
        .map(|(package, message)| format!(".{package}.{}", message.name()))
        .collect();
    let mut methods = HashMap::new();
    for file in &files {
        for service in &file.service {
            for method in &service.method {
                let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                methods.insert(path, namespaced.contains(method.input_type()));
            }
        }
    }
    methods
}

/// The namespace the single message of a gRPC request body names, if the
/// body is one uncompressed message.
fn namespace_of(body: &[u8]) -> Option<String> {
    let (header, message) = body.split_at_checked(FRAME_HEADER)?;
    let length = u32::from_be_bytes(header[1..].try_into().ok()?);
    if header[0] != 0 || usize::try_from(length).ok()? != message.len() {
        return None;
    }
    Namespaced::decode(message).ok().map(|request| request.namespace)
}

/// Lets a call to chorus's own services through only as its credentials
/// allow, the namespace its request names included.
pub(crate) async fn check(State(gate): State<Gate>, mut request: Request, next: Next) -> Response {
    if !request.uri().path().starts_with(OWN_SERVICES) {
        return next.run(request).await;
    }
    let admission = match (gate.guard)(request.headers()) {
        Ok(admission) => admission,
        Err(status) => return status.into_http(),
    };
    if let Some(caller) = admission.caller {
        request.extensions_mut().insert(Caller(caller));
    }
    let Some(allows) = admission.namespaces else {
        return next.run(request).await;
    };
    match gate.methods.get(request.uri().path()) {
        // No such method: the router answers UNIMPLEMENTED, as to anyone.
        None => return next.run(request).await,
        Some(false) => {
            return match allows(None) {
                Ok(()) => next.run(request).await,
                Err(status) => status.into_http(),
            };
        }
        Some(true) => {}
    }
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, gate.max_message_bytes + FRAME_HEADER).await {
        Ok(body) => body,
        Err(_) => {
            let limit = gate.max_message_bytes;
            return tonic::Status::resource_exhausted(format!("the request is over {limit} bytes, or was cut off"))
                .into_http();
        }
    };
    let Some(namespace) = namespace_of(&body) else {
        return tonic::Status::invalid_argument("the request is not one uncompressed message").into_http();
    };
    // An empty namespace is left to the service, which refuses it.
    if !namespace.is_empty()
        && let Err(status) = allows(Some(&namespace))
    {
        return status.into_http();
    }
    next.run(Request::from_parts(parts, Body::from(body))).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(message: &impl prost::Message) -> Vec<u8> {
        let body = message.encode_to_vec();
        let mut frame = vec![0];
        frame.extend_from_slice(&u32::try_from(body.len()).expect("small").to_be_bytes());
        frame.extend_from_slice(&body);
        frame
    }

    #[test]
    fn the_namespaced_methods_are_those_whose_request_names_it_first() {
        let methods = methods(&[chorus_proto::FILE_DESCRIPTOR_SET]);
        for namespaced in [
            "/chorus.taskstore.v1.TaskStore/CreateTask",
            "/chorus.taskstore.v1.TaskStore/ClaimTasks",
            "/chorus.hub.v1.Hub/Publish",
            "/chorus.eventbus.v1.EventBus/Subscribe",
            "/chorus.workflow.v1.Workflow/StartRun",
        ] {
            assert_eq!(methods.get(namespaced), Some(&true), "{namespaced}");
        }
        for across in ["/chorus.taskstore.v1.TaskStore/ClaimPushConfigs", "/chorus.gateway.v1.Gateway/Delegate"] {
            assert_eq!(methods.get(across), Some(&false), "{across}");
        }
    }

    #[test]
    fn the_namespace_is_read_from_the_one_message_of_the_body() {
        let request = chorus_proto::taskstore::ListTasksRequest {
            namespace: "team-a".into(),
            agent_id: "echo".into(),
            ..Default::default()
        };
        let body = frame(&request);
        assert_eq!(namespace_of(&body).as_deref(), Some("team-a"));
        assert_eq!(namespace_of(&body[..body.len() - 1]), None, "cut short");
        let mut two = body.clone();
        two.extend_from_slice(&body);
        assert_eq!(namespace_of(&two), None, "two messages");
        let mut compressed = body;
        compressed[0] = 1;
        assert_eq!(namespace_of(&compressed), None, "compressed");
        assert_eq!(namespace_of(&[]), None);
    }
}
