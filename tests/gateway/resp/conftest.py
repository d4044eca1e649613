"""Every parser test runs over every implementation: pure Python, and hiredis-backed with
runs of one command parsed in C (`_repeat.c`) or in Python."""

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


@pytest.fixture(params=["python", "hiredis", "hiredis-python-repeat"])
def make(request: pytest.FixtureRequest) -> MakeParser:
    use_hiredis = request.param != "python"
    repeat_in_c = request.param == "hiredis"

    def factory(limits: ParserLimits = DEFAULT_LIMITS) -> RequestParser:
        parser = make_parser(limits, use_hiredis=use_hiredis, repeat_in_c=repeat_in_c)
        assert isinstance(parser, HiredisRequestParser if use_hiredis else PythonRequestParser)
        return parser

    return factory
