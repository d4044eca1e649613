"""Every parser test runs over both implementations: pure Python and hiredis-backed."""

from __future__ import annotations

import pytest

from gateway.resp import (
    HiredisRequestParser,
    ParserLimits,
    PythonRequestParser,
    RequestParser,
    make_parser,
)
from tests.gateway.resp.parsing import DEFAULT_LIMITS, MakeParser


@pytest.fixture(params=["python", "hiredis"])
def make(request: pytest.FixtureRequest) -> MakeParser:
    use_hiredis = request.param == "hiredis"

    def factory(limits: ParserLimits = DEFAULT_LIMITS) -> RequestParser:
        parser = make_parser(limits, use_hiredis=use_hiredis)
        assert isinstance(parser, HiredisRequestParser if use_hiredis else PythonRequestParser)
        return parser

    return factory
