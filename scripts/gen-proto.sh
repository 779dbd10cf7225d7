#!/usr/bin/env bash
# Regenerates the committed protobuf modules from src/bookkeeper_py/wire/proto/*.proto.
# Needs grpcio-tools (pip install -e '.[dev]'). The generated code is committed so that
# installing the package needs no protoc.
set -euo pipefail
cd "$(dirname "$0")/../src"
"${PYTHON:-python}" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
    bookkeeper_py/wire/proto/bookkeeper_protocol.proto bookkeeper_py/wire/proto/data_formats.proto
