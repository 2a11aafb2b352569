"""Test support shared by the unit tests: an in-memory Kubernetes API server (``fakeapi``)."""
