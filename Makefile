# The two commands the README promises: `make demo` (the main job) and `make test` (everything).
.PHONY: demo test install lint unit integration

install:
	@scripts/install

# `make demo KEEP=1` leaves the demo's servers running (`scripts/demo --stop` stops them);
# `make demo EPOCHS=2` trains fewer epochs. `make demo TARGET=testbed`: the same flow on the
# test bed, with real pods (`scripts/demo --testbed`).
demo: install
	@$(if $(filter-out local testbed,$(TARGET)),$(error TARGET is local (the default) or testbed, not '$(TARGET)'))
	@scripts/demo $(if $(filter testbed,$(TARGET)),--testbed) $(if $(KEEP),--keep-servers) $(if $(EPOCHS),--epochs $(EPOCHS))

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
