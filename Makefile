# The two commands the README promises: `make demo` (the main job) and `make test` (everything).
.PHONY: demo test install lint unit integration

install:
	@scripts/install

# `make demo KEEP=1` leaves the demo's servers running (`scripts/demo --stop` stops them);
# `make demo EPOCHS=2` trains fewer epochs.
demo: install
	@scripts/demo $(if $(KEEP),--keep-servers) $(if $(EPOCHS),--epochs $(EPOCHS))

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
