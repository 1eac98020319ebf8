"""Generated gRPC stubs of tensile.v1 (scripts/gen_python_stubs.py); do not edit."""
