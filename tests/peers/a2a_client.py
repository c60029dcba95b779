"""The Python a2a-sdk (1.3.0) client against a chorus gateway.

Usage: a2a_client.py BASE_URL [BINDING ...]

BASE_URL is the gateway (`http://127.0.0.1:PORT`); the bindings default to
JSONRPC, HTTP+JSON and GRPC. For each binding, a client built by the SDK's
`ClientFactory` from the agents' cards (resolved by the SDK from
`BASE_URL/a2a/{agent}`) runs the same scenario:

- echo: a blocking SendMessage to `echo`, answered with a completed task
  whose artifact `echo` carries the text, then ListTasks by its context;
- stream: SendStreamingMessage `tck-stream-001` to `tck`: the Task first,
  then status and artifact updates, ending completed; then GetTask of it;
- cancel: `tck-input-required` to `tck` stops in input-required; CancelTask
  makes it canceled, and GetTask says so too;
- push: push configs of such a task are created, read, listed and deleted;
  canceling the task notifies the webhook this script serves, with the
  configured credentials and a body the SDK parses as a StreamResponse (the
  gateway must allow loopback webhooks: gateway.push.allow_private).

On success it prints one JSON line (`{"ok": true, "bindings": {...}}`) and
exits 0; on any mismatch it prints the reason to stderr and exits 1.
"""

import asyncio
import json
import socket
import sys
import uuid

import grpc
import httpx
import uvicorn
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    AuthenticationInfo,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskPushNotificationConfig,
    TaskState,
)

BINDINGS = ('JSONRPC', 'HTTP+JSON', 'GRPC')
ECHO_TEXT = 'hello from the python a2a-sdk'
STREAM_TEXT = 'Stream hello from TCK'
TIMEOUT_S = 30
PUSH_CREDENTIALS = 'webhook-secret'


class Mismatch(Exception):
    """The gateway answered something the scenario does not expect."""


def expect(condition, what):
    if not condition:
        raise Mismatch(what)


def state_name(state):
    return TaskState.Name(state)


def user_message(text, message_id=None):
    return Message(
        role=Role.ROLE_USER,
        message_id=message_id or str(uuid.uuid4()),
        parts=[Part(text=text)],
    )


def artifact_texts(artifacts, name=None):
    return [
        part.text
        for artifact in artifacts
        if name is None or artifact.name == name
        for part in artifact.parts
        if part.text
    ]


class Webhook:
    """A push-notification receiver on a free loopback port."""

    def __init__(self):
        self.received = asyncio.Queue()
        self.server = None
        self.serving = None
        self.url = None

    async def receive(self, request):
        body = await request.json()
        await self.received.put((request.headers.get('authorization'), body))
        return Response(status_code=200)

    async def start(self):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(('127.0.0.1', 0))
        self.url = f'http://127.0.0.1:{listener.getsockname()[1]}/hook'
        app = Starlette(routes=[Route('/hook', self.receive, methods=['POST'])])
        self.server = uvicorn.Server(uvicorn.Config(app, log_level='warning'))
        self.serving = asyncio.create_task(self.server.serve(sockets=[listener]))
        while not self.server.started:
            if self.serving.done():
                await self.serving  # raises why it stopped, if it did
                raise Mismatch('the webhook stopped before it served')
            await asyncio.sleep(0.01)

    async def stop(self):
        self.server.should_exit = True
        await self.serving

    async def notification(self, task_id, state):
        """The notification that `task_id` reached `state`; the ones before it are checked, then dropped."""
        while True:
            authorization, body = await self.received.get()
            expected = f'Bearer {PUSH_CREDENTIALS}'
            expect(authorization == expected, f'a notification came with Authorization {authorization!r}')
            try:
                event = json_format.ParseDict(body, StreamResponse())
            except json_format.ParseError as error:
                raise Mismatch(f'a notification is no StreamResponse ({error}): {body}') from error
            kind = event.WhichOneof('payload')
            if kind == 'task':
                notified = (event.task.id, event.task.status.state)
            elif kind == 'status_update':
                notified = (event.status_update.task_id, event.status_update.status.state)
            else:
                continue
            if notified == (task_id, state):
                return kind


class Peer:
    """One binding's clients of the gateway's agents."""

    def __init__(self, base_url, binding, webhook):
        self.base_url = base_url.rstrip('/')
        self.binding = binding
        self.webhook = webhook
        self.http = httpx.AsyncClient(timeout=TIMEOUT_S)
        self.channels = []

    def channel(self, target):
        channel = grpc.aio.insecure_channel(target)
        self.channels.append(channel)
        return channel

    async def card(self, agent):
        resolver = A2ACardResolver(self.http, f'{self.base_url}/a2a/{agent}')
        card = await resolver.get_agent_card()
        bindings = {i.protocol_binding: i for i in card.supported_interfaces}
        expect(self.binding in bindings, f'{agent} card lists no {self.binding} interface: {card}')
        expect(
            bindings[self.binding].protocol_version == '1.0',
            f'{agent} card: {self.binding} interface is not protocol 1.0',
        )
        return card

    async def client(self, agent, streaming):
        config = ClientConfig(
            streaming=streaming,
            httpx_client=self.http,
            grpc_channel_factory=self.channel,
            supported_protocol_bindings=[self.binding],
            use_client_preference=True,
        )
        return ClientFactory(config).create(await self.card(agent))

    async def close(self):
        await self.http.aclose()
        for channel in self.channels:
            await channel.close()

    async def send_blocking(self, client, message):
        events = [event async for event in client.send_message(SendMessageRequest(message=message))]
        expect(len(events) == 1, f'a blocking send answered {len(events)} responses')
        expect(events[0].HasField('task'), f'a blocking send answered no task: {events[0]}')
        return events[0].task

    async def echo(self):
        client = await self.client('echo', streaming=False)
        task = await self.send_blocking(client, user_message(ECHO_TEXT))
        state = state_name(task.status.state)
        expect(state == 'TASK_STATE_COMPLETED', f'echo task ended {state}')
        texts = artifact_texts(task.artifacts, name='echo')
        expect(texts == [ECHO_TEXT], f'echo artifact carries {texts}, not [{ECHO_TEXT!r}]')
        reply = [part.text for part in task.status.message.parts]
        expect(reply == [ECHO_TEXT], f'echo answered {reply}, not [{ECHO_TEXT!r}]')
        listed = await client.list_tasks(ListTasksRequest(context_id=task.context_id))
        ids = [listed_task.id for listed_task in listed.tasks]
        expect(ids == [task.id], f'ListTasks of context {task.context_id} gave {ids}, not [{task.id}]')
        return {'state': state, 'artifact': texts[0], 'listed': len(ids)}

    async def stream(self):
        client = await self.client('tck', streaming=True)
        message = user_message('stream please', message_id=f'tck-stream-001-{uuid.uuid4()}')
        kinds, states, texts, task_id = [], [], [], None
        async for event in client.send_message(SendMessageRequest(message=message)):
            kind = event.WhichOneof('payload')
            kinds.append(kind)
            if kind == 'task':
                task_id = event.task.id
                states.append(state_name(event.task.status.state))
            elif kind == 'status_update':
                expect(event.status_update.task_id == task_id, 'a status update of another task')
                states.append(state_name(event.status_update.status.state))
            elif kind == 'artifact_update':
                expect(event.artifact_update.task_id == task_id, 'an artifact update of another task')
                texts.extend(artifact_texts([event.artifact_update.artifact]))
        expect(kinds and kinds[0] == 'task', f'the stream did not start with the Task: {kinds}')
        expect('message' not in kinds, f'a task stream carried a message: {kinds}')
        expect(kinds.count('task') == 1 or kinds[-1] == 'task', f'a Task in the middle of the stream: {kinds}')
        expect('artifact_update' in kinds, f'no artifact update: {kinds}')
        expect('TASK_STATE_WORKING' in states, f'never working: {states}')
        expect(states[-1] == 'TASK_STATE_COMPLETED', f'the stream ended in {states[-1]}: {states}')
        expect(
            kinds.index('artifact_update') < len(kinds) - 1 - kinds[::-1].index('status_update'),
            f'the artifact came after the last status: {kinds}',
        )
        expect(texts == [STREAM_TEXT], f'streamed artifact texts {texts}')
        task = await client.get_task(GetTaskRequest(id=task_id))
        state = state_name(task.status.state)
        expect(state == 'TASK_STATE_COMPLETED', f'GetTask after the stream says {state}')
        stored = artifact_texts(task.artifacts)
        expect(stored == [STREAM_TEXT], f'GetTask artifacts {stored}')
        return {'events': kinds, 'states': states, 'get': state}

    async def cancel(self):
        client = await self.client('tck', streaming=False)
        message = user_message('wait for me', message_id=f'tck-input-required-{uuid.uuid4()}')
        task = await self.send_blocking(client, message)
        before = state_name(task.status.state)
        expect(before == 'TASK_STATE_INPUT_REQUIRED', f'tck-input-required ended {before}')
        canceled = await client.cancel_task(CancelTaskRequest(id=task.id))
        after = state_name(canceled.status.state)
        expect(canceled.id == task.id, f'CancelTask answered task {canceled.id}, not {task.id}')
        expect(after == 'TASK_STATE_CANCELED', f'CancelTask left the task {after}')
        got = state_name((await client.get_task(GetTaskRequest(id=task.id))).status.state)
        expect(got == 'TASK_STATE_CANCELED', f'GetTask after CancelTask says {got}')
        return {'before': before, 'after': after, 'get': got}

    async def push(self):
        client = await self.client('tck', streaming=False)
        message = user_message('notify me', message_id=f'tck-input-required-{uuid.uuid4()}')
        task = await self.send_blocking(client, message)
        config = TaskPushNotificationConfig(
            task_id=task.id,
            id=f'hook-{uuid.uuid4()}',
            url=self.webhook.url,
            token='push-token',
            authentication=AuthenticationInfo(scheme='Bearer', credentials=PUSH_CREDENTIALS),
        )
        created = await client.create_task_push_notification_config(config)
        expect((created.task_id, created.url) == (task.id, self.webhook.url), f'created push config {created}')
        expect(created.id == config.id, f'the push config was created as {created.id!r}, not {config.id!r}')
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task.id, id=config.id)
        )
        expect(got.url == self.webhook.url, f'GetTaskPushNotificationConfig answered {got}')
        listed = await client.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=task.id))
        expect([c.id for c in listed.configs] == [config.id], f'ListTaskPushNotificationConfigs answered {listed}')
        await client.cancel_task(CancelTaskRequest(id=task.id))
        notified = await self.webhook.notification(task.id, TaskState.TASK_STATE_CANCELED)
        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task.id, id=config.id)
        )
        left = await client.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=task.id))
        expect(not left.configs, f'configs left after DeleteTaskPushNotificationConfig: {left}')
        return {'listed': len(listed.configs), 'notified': notified, 'left': len(left.configs)}


async def run_binding(base_url, binding, webhook):
    peer = Peer(base_url, binding, webhook)
    try:
        results = {}
        for name in ('echo', 'stream', 'cancel', 'push'):
            try:
                results[name] = await asyncio.wait_for(getattr(peer, name)(), TIMEOUT_S)
            except Mismatch:
                raise
            except Exception as error:  # noqa: BLE001 - every failure is reported with its step
                raise Mismatch(f'{type(error).__name__}: {error}') from error
        return results
    finally:
        await peer.close()


async def default_card(base_url):
    """The gateway's own card names the default agent, `echo`."""
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
        card = await A2ACardResolver(http, base_url).get_agent_card()
    urls = [i.url for i in card.supported_interfaces if i.protocol_binding == 'JSONRPC']
    expect(urls == [f'{base_url.rstrip("/")}/a2a/echo'], f'the default card offers JSON-RPC at {urls}')
    return card.name


async def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    base_url, bindings = argv[1], argv[2:] or list(BINDINGS)
    results = {'ok': True, 'default_card': None, 'bindings': {}}
    webhook = Webhook()
    await webhook.start()
    try:
        results['default_card'] = await default_card(base_url)
        for binding in bindings:
            try:
                results['bindings'][binding] = await run_binding(base_url, binding, webhook)
            except Mismatch as mismatch:
                raise Mismatch(f'{binding}: {mismatch}') from mismatch
    except Mismatch as mismatch:
        print(f'a2a-sdk client: {mismatch}', file=sys.stderr)
        return 1
    finally:
        await webhook.stop()
    print(json.dumps(results))
    return 0


if __name__ == '__main__':
    sys.exit(asyncio.run(main(sys.argv)))
