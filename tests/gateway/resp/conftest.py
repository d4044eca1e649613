"""Every parser test runs over every implementation (`parsing.PARSERS`): pure Python, and
hiredis-backed with runs of one command parsed in C (`_repeat.c`) or in Python."""

from __future__ import annotations

import pytest

from gateway.resp import HiredisRequestParser, ParserLimits, PythonRequestParser, RequestParser
from tests.gateway.resp.parsing import DEFAULT_LIMITS, PARSERS, MakeParser


@pytest.fixture(params=list(PARSERS))
def make(request: pytest.FixtureRequest) -> MakeParser:
    use_hiredis = request.param != "python"
    make_one = PARSERS[request.param]

    def factory(limits: ParserLimits = DEFAULT_LIMITS) -> RequestParser:
        parser = make_one(limits)
        assert isinstance(parser, HiredisRequestParser if use_hiredis else PythonRequestParser)
        return parser

    return factory
