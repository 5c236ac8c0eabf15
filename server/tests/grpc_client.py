#!/usr/bin/env python3
"""An independent gRPC client (Python grpcio) against a running vallumd.

Usage: grpc_client.py HOST:PORT
Lists the services through server reflection (grpcio-reflection's ProtoReflectionDescriptorDatabase)
and asks grpc.health.v1 for the overall status. Prints one JSON object; exits 1 when a check fails.
"""
import json
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

EXPECTED = {
    "vallum.v1.RulesetService",
    "vallum.v1.CounterService",
    "vallum.v1.TraceService",
    "vallum.v1.EngineService",
    "grpc.health.v1.Health",
}


def main() -> int:
    channel = grpc.insecure_channel(sys.argv[1])
    services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    serving = health.status == health_pb2.HealthCheckResponse.SERVING
    missing = sorted(EXPECTED - services)
    print(json.dumps({"services": sorted(services), "missing": missing, "serving": serving}))
    return 0 if serving and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
