//! gRPC server reflection on a running `chorus dev`: what `grpcurl` and
//! other generic clients rely on to discover the services.

use chorus_tests::Sandbox;
use prost::Message as _;
use prost_types::FileDescriptorProto;
use tonic::transport::Channel;
use tonic_reflection::pb::{v1, v1alpha};

const TASK_STORE: &str = "chorus.taskstore.v1.TaskStore";
const EVENT_BUS: &str = "chorus.eventbus.v1.EventBus";
const HUB: &str = "chorus.hub.v1.Hub";
const HEALTH: &str = "grpc.health.v1.Health";
const A2A: &str = "lf.a2a.v1.A2AService";

/// Sends one reflection request (v1) and returns its answer.
async fn ask(
    channel: &Channel,
    request: v1::server_reflection_request::MessageRequest,
) -> v1::server_reflection_response::MessageResponse {
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1::ServerReflectionRequest { host: String::new(), message_request: Some(request) };
    let mut responses =
        client.server_reflection_info(tokio_stream::iter([request])).await.expect("reflection").into_inner();
    let response = responses.message().await.expect("a reflection answer").expect("the stream answers");
    response.message_response.expect("a reflection answer has a body")
}

/// The file descriptors reflection (v1) sends for `symbol`.
async fn files_containing(channel: &Channel, symbol: &str) -> Vec<FileDescriptorProto> {
    use v1::{server_reflection_request::MessageRequest, server_reflection_response::MessageResponse};
    let answer = ask(channel, MessageRequest::FileContainingSymbol(symbol.to_owned())).await;
    let MessageResponse::FileDescriptorResponse(files) = answer else {
        panic!("FileContainingSymbol({symbol}) answered {answer:?}");
    };
    let decode = |bytes: &Vec<u8>| FileDescriptorProto::decode(bytes.as_slice()).expect("a file descriptor");
    files.file_descriptor_proto.iter().map(decode).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1_lists_the_services_and_describes_the_task_store_the_event_bus_and_the_hub() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let channel = server.channel().await;

    use v1::{server_reflection_request::MessageRequest, server_reflection_response::MessageResponse};
    let MessageResponse::ListServicesResponse(listed) =
        ask(&channel, MessageRequest::ListServices(String::new())).await
    else {
        panic!("ListServices answered something else");
    };
    let names: Vec<&str> = listed.service.iter().map(|service| service.name.as_str()).collect();
    for service in [TASK_STORE, EVENT_BUS, HUB, HEALTH] {
        assert!(names.contains(&service), "{service} is not in {names:?}");
    }

    let files = files_containing(&channel, TASK_STORE).await;
    let file = files.iter().find(|file| file.package() == "chorus.taskstore.v1").expect("the task store's file");
    assert_eq!(file.name(), "chorus/taskstore/v1/taskstore.proto");
    let service = file.service.iter().find(|service| service.name() == "TaskStore").expect("the TaskStore service");
    let claim = service.method.iter().find(|method| method.name() == "ClaimTasks").expect("ClaimTasks");
    assert_eq!(claim.input_type(), ".chorus.taskstore.v1.ClaimTasksRequest");
    assert!(claim.server_streaming(), "ClaimTasks streams claimed tasks");

    let files = files_containing(&channel, EVENT_BUS).await;
    let file = files.iter().find(|file| file.package() == "chorus.eventbus.v1").expect("the event bus's file");
    assert_eq!(file.name(), "chorus/eventbus/v1/eventbus.proto");
    let service = file.service.iter().find(|service| service.name() == "EventBus").expect("the EventBus service");
    let subscribe = service.method.iter().find(|method| method.name() == "Subscribe").expect("Subscribe");
    assert_eq!(subscribe.output_type(), ".chorus.eventbus.v1.Delivery");
    assert!(subscribe.server_streaming(), "Subscribe streams deliveries");

    let files = files_containing(&channel, HUB).await;
    let file = files.iter().find(|file| file.package() == "chorus.hub.v1").expect("the hub's file");
    assert_eq!(file.name(), "chorus/hub/v1/hub.proto");
    let service = file.service.iter().find(|service| service.name() == "Hub").expect("the Hub service");
    let stream = service.method.iter().find(|method| method.name() == "StreamInbox").expect("StreamInbox");
    assert_eq!(stream.output_type(), ".chorus.hub.v1.Message");
    assert!(stream.server_streaming(), "StreamInbox streams inbox messages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1alpha_lists_the_services_too() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;

    use v1alpha::{server_reflection_request::MessageRequest, server_reflection_response::MessageResponse};
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(server.channel().await);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses =
        client.server_reflection_info(tokio_stream::iter([request])).await.expect("reflection").into_inner();
    let response = responses.message().await.expect("an answer").expect("the stream answers");
    let Some(MessageResponse::ListServicesResponse(listed)) = response.message_response else {
        panic!("ListServices answered {response:?}");
    };
    let names: Vec<&str> = listed.service.iter().map(|service| service.name.as_str()).collect();
    for service in [TASK_STORE, EVENT_BUS, HUB, HEALTH] {
        assert!(names.contains(&service), "{service} is not in {names:?}");
    }
}

/// What the server answers a call of `method` (`/package.Service/Method`)
/// with an empty request: an empty message is valid for every proto3 request.
async fn call_empty(channel: &Channel, method: &str, server_streaming: bool) -> tonic::Code {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("the channel is ready");
    let path = method.parse().expect("a method path");
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    let answer = match server_streaming {
        true => grpc.server_streaming(tonic::Request::new(()), path, codec).await.map(drop),
        false => grpc.unary(tonic::Request::new(()), path, codec).await.map(drop),
    };
    answer.err().map_or(tonic::Code::Ok, |status| status.code())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_describes_the_a2a_service_and_every_method_it_describes_is_served() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let channel = server.channel().await;

    use v1::{server_reflection_request::MessageRequest, server_reflection_response::MessageResponse};
    let MessageResponse::ListServicesResponse(listed) =
        ask(&channel, MessageRequest::ListServices(String::new())).await
    else {
        panic!("ListServices answered something else");
    };
    assert!(listed.service.iter().any(|service| service.name == A2A), "{A2A} is not listed: {listed:?}");

    let files = files_containing(&channel, A2A).await;
    let file = files.iter().find(|file| file.package() == "lf.a2a.v1").expect("the A2A file");
    let service = file.service.iter().find(|service| service.name() == "A2AService").expect("the A2AService");
    let send = service.method.iter().find(|method| method.name() == "SendMessage").expect("SendMessage");
    assert_eq!(send.input_type(), ".lf.a2a.v1.SendMessageRequest");
    // A generic client (grpcurl) then asks for each import by name.
    for dependency in &file.dependency {
        let answer = ask(&channel, MessageRequest::FileByFilename(dependency.clone())).await;
        assert!(matches!(answer, MessageResponse::FileDescriptorResponse(_)), "{dependency}: {answer:?}");
    }

    // The schema is a copy (proto/a2a): each method it describes must be one
    // the gateway serves, whatever an empty request gets from it.
    for method in &service.method {
        let path = format!("/{A2A}/{}", method.name());
        let code = call_empty(&channel, &path, method.server_streaming()).await;
        assert_ne!(code, tonic::Code::Unimplemented, "{path} is described but not served");
    }
}
