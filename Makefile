# The README's commands. `make run` starts the stack; `make test` tests it.

CARGO ?= cargo
TARGET_DIR := $(abspath $(or $(CARGO_TARGET_DIR),target))
# End-to-end tests start the real binary; `make test` builds it first.
export CHORUS_BIN ?= $(TARGET_DIR)/debug/chorus
# The interop tests' real peers (tests/peers), installed by `make peers`: the
# Python a2a-sdk's venv and the grpc-web client's node_modules. The tests fail
# when these are set and the peer is broken, and skip when they are unset. (Not
# CHORUS_*: chorus reads every CHORUS_* variable as configuration.)
PEERS_DIR := $(TARGET_DIR)/peers
export PEERS_PYTHON ?= $(PEERS_DIR)/venv/bin/python
export PEERS_NODE_DIR ?= $(PEERS_DIR)/grpc-web
export PEERS_ACP_DIR ?= $(PEERS_DIR)/acp

.PHONY: run test peers lint fmt bench up conformance

## run: every service and the demo agents in one process (SQLite in ./.chorus)
run:
	$(CARGO) run --bin chorus -- dev

## test: every test on SQLite, and on PostgreSQL when CHORUS_TEST_POSTGRES_URL is set
test: peers
	$(CARGO) build --bin chorus
	$(CARGO) test --workspace

## peers: the interop tests' peers under $(PEERS_DIR), each installed once per version of its
## pinned requirements (needs python3 with venv, node and npm; PyPI and npm reachable)
peers:
	bash tests/peers/provision.sh $(PEERS_DIR)

## lint: formatting and clippy, warnings denied
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## bench: task-store round trips (PostgreSQL, SQLite), event-bus throughput through a 3-handler
## chain (PostgreSQL; NATS JetStream on 127.0.0.1:4222 beside it) and hub topic fan-out and direct
## round trips (PostgreSQL, SQLite; JetStream and Redis Streams on 127.0.0.1:6379 beside them),
## against the raw commit rate; A2A gateway SendMessage at 1/16/64 clients (SQLite, PostgreSQL)
## against the a2a-sdk 1.3.0 server of ../shared/peers (a venv in target/bench/peers-venv, made
## once with python3 and pip) and chorus's RSS with 1,000 open SSE streams (needs ulimit -n ≥ 1256);
## workflow steps/s (10 webhook steps, 64 runs in flight, PostgreSQL), commits per step, resume after SIGKILL
bench:
	$(CARGO) run --release -p chorus-bench

## up: the whole stack on PostgreSQL with an OpenTelemetry collector (needs Docker)
up:
	docker compose up --build

## conformance: the A2A conformance kit against `chorus dev` (TCK=path of an a2a-tck clone with its venv)
conformance:
	$(CARGO) build --bin chorus
	CHORUS_BIN=$(CHORUS_BIN) scripts/conformance $(TCK)
