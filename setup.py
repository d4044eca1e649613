"""The optional C fast path of the Dafka engine (backends/dafka/_zmqbatch.c); everything
else is declared in pyproject.toml. Without a C compiler the install still succeeds and
the engine runs its Python paths (backends/dafka/held_send.py, held_recv.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "backends.dafka._zmqbatch",
            ["backends/dafka/_zmqbatch.c"],
            libraries=["dl"],  # dlopen/dlsym: in libc itself since glibc 2.34
            optional=True,
        )
    ]
)
