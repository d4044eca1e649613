"""The optional C fast paths: the Dafka engine's (backends/dafka/_zmqbatch.c) and the
request parser's (gateway/resp/_repeat.c); everything else is declared in pyproject.toml.
Without a C compiler the install still succeeds, and the engine and the parser run their
Python paths (backends/dafka/held_send.py, held_recv.py; gateway/resp/fastpath.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "backends.dafka._zmqbatch",
            ["backends/dafka/_zmqbatch.c"],
            libraries=["dl"],  # dlopen/dlsym: in libc itself since glibc 2.34
            optional=True,
        ),
        Extension("gateway.resp._repeat", ["gateway/resp/_repeat.c"], optional=True),
    ]
)
