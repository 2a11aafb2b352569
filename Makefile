# The two commands the README promises: `make demo` (the main job) and `make test` (everything).
.PHONY: demo test install lint unit integration

install:
	@scripts/install

demo: install
	@scripts/demo

test: install
	@scripts/test

# Finer-grained targets for development.
lint: install
	uv run ruff check kubedl_prefect tests bench
	uv run ruff format --check kubedl_prefect tests bench
	uv run mypy
	uv run lint-imports

unit: install
	uv run pytest -m "not integration"

integration: install
	uv run pytest -m integration
