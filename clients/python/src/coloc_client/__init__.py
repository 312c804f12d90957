"""Python client of coloc, the GPU colocation advisor (gRPC service coloc.v1.ColocationAdvisor).

``Advisor`` is a thin typed wrapper over the stubs generated from proto/coloc/v1/advisor.proto
at build time (``coloc_client.pb`` holds the messages); a failed call raises ``AdvisorError``
with the gRPC status code and, for invalid requests, the fields at fault. ``push_throughput``
and ``ThroughputPusher`` send a workload's throughput to the observer's push endpoint.
"""

from importlib.metadata import version as _version
from importlib.resources import files as _files

from ._advisor import Advisor, AdvisorError, FieldViolation
from ._push import PushError, ThroughputPusher, push_throughput
from ._proto import advisor_pb2 as pb

__version__ = _version("coloc-client")
#: The proto package the stubs were generated from; its version is the package's major version.
PROTO_PACKAGE = pb.DESCRIPTOR.package
#: SHA-256 of the advisor.proto the stubs were generated from.
PROTO_SHA256 = (_files(__name__) / "_proto" / "PROTO_SHA256").read_text().strip()

__all__ = ["Advisor", "AdvisorError", "FieldViolation", "PushError", "ThroughputPusher", "push_throughput", "pb", "PROTO_PACKAGE", "PROTO_SHA256", "__version__"]
