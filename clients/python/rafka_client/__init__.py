"""rafka_client: produce, consume and read records through a rafka gateway, on redis-py.

    from rafka_client import Consumer, Producer, Reader

    with Producer("redis://127.0.0.1:6380") as producer:
        producer.produce("greetings", b"hello", key="user-1")
    # flushed on exit: raises if records stay outstanding

    with Consumer("my-group", "worker-1", "greetings") as consumer:
        for record in consumer:          # acked once processed
            print(record.partition, record.offset, record.value)

    with Reader() as reader:
        reader.read("greetings", 0, 10, 19)   # offsets 10..19 of partition 0

It works unchanged against plain Redis as a test double; see clients/python/README.md.
"""

from rafka_client.consumer import Consumer
from rafka_client.errors import (
    AckError,
    BatchFailure,
    ConnectionLost,
    ConsumeError,
    DeliveryUnknown,
    FlushTimeout,
    NotHeld,
    ProduceError,
    RafkaError,
    RangeTooLarge,
    ReadError,
    UnknownPartition,
)
from rafka_client.producer import Producer
from rafka_client.reader import Reader
from rafka_client.records import Record

__all__ = [
    "AckError",
    "BatchFailure",
    "ConnectionLost",
    "ConsumeError",
    "Consumer",
    "DeliveryUnknown",
    "FlushTimeout",
    "NotHeld",
    "ProduceError",
    "Producer",
    "RafkaError",
    "RangeTooLarge",
    "ReadError",
    "Reader",
    "Record",
    "UnknownPartition",
]
