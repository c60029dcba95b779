# The README's commands. `make run` starts the stack; `make test` tests it.

CARGO ?= cargo
TARGET_DIR := $(abspath $(or $(CARGO_TARGET_DIR),target))
# End-to-end tests start the real binary; `make test` builds it first.
export CHORUS_BIN ?= $(TARGET_DIR)/debug/chorus

.PHONY: run test lint fmt bench up conformance

## run: every service and the demo agents in one process (SQLite in ./.chorus)
run:
	$(CARGO) run --bin chorus -- dev

## test: every test on SQLite, and on PostgreSQL when CHORUS_TEST_POSTGRES_URL is set
test:
	$(CARGO) build --bin chorus
	$(CARGO) test --workspace

## lint: formatting and clippy, warnings denied
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## bench: task-store round trips (PostgreSQL, SQLite), event-bus throughput through a 3-handler
## chain (PostgreSQL; NATS JetStream on 127.0.0.1:4222 beside it) and hub topic fan-out and direct
## round trips (PostgreSQL, SQLite; JetStream and Redis Streams on 127.0.0.1:6379 beside them),
## against the raw commit rate
bench:
	$(CARGO) run --release -p chorus-bench

## up: the whole stack on PostgreSQL with an OpenTelemetry collector (needs Docker)
up:
	docker compose up --build

## conformance: the A2A conformance kit against `chorus dev` (TCK=path of an a2a-tck clone with its venv)
conformance:
	$(CARGO) build --bin chorus
	CHORUS_BIN=$(CHORUS_BIN) scripts/conformance $(TCK)
