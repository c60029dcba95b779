"""An A2A 1.0 agent on the Python a2a-sdk (1.3.0) server, for chorus to delegate to.

Usage: echo_agent.py PORT   (0: any free port)

It answers every message with a task that carries one artifact, `echo`, whose
text is "py:" + the message's text, and completes with the same text as its
status message. A message whose text starts with "ask:" makes it ask for more
first (input-required, "py:what else?"); the answer, sent into the same task,
completes it with "py:" + both texts joined by "+". JSON-RPC is served at `/`,
HTTP+JSON under `/rest`, the card at `/.well-known/agent-card.json`; tasks
live in memory; streaming is on.

Once it listens it prints `a2a-sdk echo agent listening on http://127.0.0.1:PORT`.
"""

import asyncio
import socket
import sys

import uvicorn
from starlette.applications import Starlette

from a2a.helpers import get_message_text, new_task
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part, Role, TaskState

HOST = '127.0.0.1'
READY = 'a2a-sdk echo agent listening on '
PREFIX = 'py:'
ASK = 'ask:'


def user_texts(context: RequestContext) -> list[str]:
    """The texts of the task's user messages so far, this one last."""
    history = list(context.current_task.history) if context.current_task else []
    earlier = [m for m in history if m.role == Role.ROLE_USER and m.message_id != context.message.message_id]
    return [get_message_text(m) for m in earlier] + [context.get_user_input()]


class PrefixEcho(AgentExecutor):
    """Echoes the user's text, prefixed, as an artifact and the final status."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        new = context.current_task is None
        if new:  # the SDK wants the Task before any update
            task = new_task(
                context.task_id,
                context.context_id,
                TaskState.TASK_STATE_SUBMITTED,
                history=[context.message],
            )
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        texts = user_texts(context)
        if new and texts[-1].startswith(ASK):
            await updater.requires_input(updater.new_agent_message([Part(text=PREFIX + 'what else?')]))
            print(f'asked in task {context.task_id}', flush=True)
            return
        text = PREFIX + '+'.join(texts)
        await updater.add_artifact([Part(text=text)], name='echo')
        await updater.complete(updater.new_agent_message([Part(text=text)]))
        print(f'served task {context.task_id}: {text}', flush=True)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def agent_card(base_url: str) -> AgentCard:
    return AgentCard(
        name='Python echo',
        description='Echoes the text it is sent, prefixed with "py:".',
        version='1.0.0',
        supported_interfaces=[
            AgentInterface(protocol_binding='JSONRPC', protocol_version='1.0', url=f'{base_url}/'),
            AgentInterface(protocol_binding='HTTP+JSON', protocol_version='1.0', url=f'{base_url}/rest'),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=['text/plain'],
        default_output_modes=['text/plain'],
        skills=[AgentSkill(id='echo', name='Echo', description='Echoes text with a prefix', tags=['echo'])],
    )


def app(base_url: str) -> Starlette:
    card = agent_card(base_url)
    handler = DefaultRequestHandler(agent_executor=PrefixEcho(), task_store=InMemoryTaskStore(), agent_card=card)
    routes = [
        *create_agent_card_routes(agent_card=card),
        *create_jsonrpc_routes(request_handler=handler, rpc_url='/'),
        *create_rest_routes(request_handler=handler, path_prefix='/rest'),
    ]
    return Starlette(routes=routes)


async def serve(port: int) -> None:
    # Bound before the card is built, so that port 0 works.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, port))
    base_url = f'http://{HOST}:{listener.getsockname()[1]}'
    server = uvicorn.Server(uvicorn.Config(app(base_url), log_level='warning'))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        if serving.done():
            await serving  # raises why it stopped, if it did
            sys.exit('the server stopped before it served')
        await asyncio.sleep(0.01)
    print(READY + base_url, flush=True)
    await serving


if __name__ == '__main__':
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    asyncio.run(serve(int(sys.argv[1])))
