"""schemathesis over `/openapi.json`, every check on, against the server on the fake engine.

Each operation gets schemathesis' explicit examples, its coverage cases and 25 generated
bodies (valid and invalid), deterministically (`derandomize`), in process (the ASGI app, no
socket). Every response must match the document: its status listed, its body the declared
schema (errors always `ErrorBody`, with a `code`), no 5xx, invalid data refused, the key
enforced, undeclared methods a 405 with `Allow`.

Two allowances, both for what a static schema cannot say:

- `positive_data_acceptance` counts a 400 as an answer to a schema-valid body. Some refusals
  depend on the loaded model or on other fields: a prompt longer than the context, a token id
  beyond the vocabulary, `best_of` other than `n`, features the server does not offer
  (`logprobs`, `echo`), `LoadSettings`' own ranges (context ≥ 16, draft k 1..32). The 400
  must still be an `ErrorBody` with a code (`response_schema_conformance`).
- `GET /api/metrics/stream` never ends (it sends a snapshot a second until the client
  leaves); test_api.py reads its first events.

The schema is read at import, as schemathesis' pytest integration does; the engine behind the
app starts in a module fixture.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import PositiveDataAcceptanceConfig
from schemathesis.core.result import Ok

from runtime.server import ServerLimits, create_app
from runtime.settings.load import LoadSettings
from tests.server.conftest import API_KEY, fake_gguf
from tests.server.fake_engine import FakeEngine

AUTH = {"Authorization": f"Bearer {API_KEY}"}
EXAMPLES_PER_ROUTE = 25

ENGINE = FakeEngine()
# An empty library (never created): every model path a generated load names is missing (404)
# or outside it (403).
LIBRARY = Path(tempfile.gettempdir()) / "outrider-schemathesis-empty-library"
APP = create_app(ENGINE, api_key=API_KEY, models_dir=LIBRARY,
                 limits=ServerLimits(max_tokens=32, metrics_interval_s=0.05))

schema = schemathesis.openapi.from_asgi("/openapi.json", APP, headers=AUTH).exclude(
    path="/api/metrics/stream")
schema.config.checks.positive_data_acceptance = PositiveDataAcceptanceConfig(
    expected_statuses=["2xx", "400", "403", "404", "409"])


@pytest.fixture(scope="module", autouse=True)
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeEngine]:
    ENGINE.start()
    ENGINE.load(LoadSettings(model_path=fake_gguf(tmp_path_factory.mktemp("m") / "fake.gguf")))
    yield ENGINE
    ENGINE.stop()


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.data_too_large])
def test_the_server_does_what_its_openapi_document_says(case: schemathesis.Case) -> None:
    case.call_and_validate(headers=AUTH)


def test_the_document_covers_every_route() -> None:
    """Nothing is left out by accident: the only operation not fuzzed is the endless stream."""
    operations = [result.ok() for result in schema.get_all_operations()
                  if isinstance(result, Ok)]  # an Err: a route the schema cannot describe
    fuzzed = {(op.method.upper(), op.path) for op in operations}
    assert len(operations) == len(list(schema.get_all_operations()))
    assert ("POST", "/v1/chat/completions") in fuzzed and ("POST", "/api/load") in fuzzed
    documented = {(method.upper(), path) for path, ops in APP.openapi()["paths"].items()
                  for method in ops}
    assert documented - fuzzed == {("GET", "/api/metrics/stream")}
