"""Generates the gRPC stubs of coloc_client from the repository's proto/ at build time.

pip builds this package in place (``pip install clients/python``), so ../../proto is the proto
the server was built from. The stubs are written into the build tree only (never committed),
with the SHA-256 of the proto they came from, which the package exposes as PROTO_SHA256.
"""

import hashlib
import pathlib
import re

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTO = PROTO_ROOT / "coloc" / "v1" / "advisor.proto"


def generate(out_dir: pathlib.Path) -> None:
    """Runs protoc (grpcio-tools) on advisor.proto into out_dir, imports made package-relative."""
    import grpc_tools
    from grpc_tools import protoc

    if not PROTO.is_file():
        raise SystemExit(f"coloc-client: {PROTO} not found; build from the coloc repository")
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    with __import__("tempfile").TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(PROTO),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("coloc-client: protoc failed on " + str(PROTO))
        generated = pathlib.Path(tmp) / "coloc" / "v1"
        for name in ("advisor_pb2.py", "advisor_pb2.pyi", "advisor_pb2_grpc.py"):
            text = (generated / name).read_text()
            # protoc writes absolute imports (from coloc.v1 import advisor_pb2); the stubs live
            # inside coloc_client._proto instead.
            text = re.sub(r"^from coloc\.v1 import ", "from . import ", text, flags=re.M)
            (out_dir / name).write_text(text)
    (out_dir / "__init__.py").write_text('"""Stubs generated from proto/coloc/v1/advisor.proto at build time."""\n')
    (out_dir / "PROTO_SHA256").write_text(hashlib.sha256(PROTO.read_bytes()).hexdigest() + "\n")


class BuildPyWithStubs(build_py):
    """build_py that first generates coloc_client._proto into the build directory."""

    def run(self):
        super().run()
        generate(pathlib.Path(self.build_lib) / "coloc_client" / "_proto")


def runtime_requirements() -> list:
    """The protobuf and grpcio the stubs generated here need: those grpcio-tools built them with."""
    from importlib.metadata import version

    return [
        f"grpcio>={version('grpcio')}",
        f"protobuf>={version('protobuf')},<{int(version('protobuf').split('.')[0]) + 1}",
        "googleapis-common-protos>=1.60",
    ]


setup(cmdclass={"build_py": BuildPyWithStubs}, install_requires=runtime_requirements())
