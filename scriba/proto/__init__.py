"""The wire protocol (``scriba.v1``): ``scriba.proto`` and its committed generated code (``scriba_pb2``, ``scriba_pb2_grpc``)."""
