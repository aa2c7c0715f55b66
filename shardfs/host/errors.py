"""Why a host refuses a publish or an unpublish: the caller is told code (a gRPC status name, as CSI has kubelet
told it: INVALID_ARGUMENT, NOT_FOUND, ...) and why, in one line."""

from __future__ import annotations


class PublishError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Busy(PublishError):
    """Another operation on the target is in progress (CSI: ABORTED, and kubelet retries)."""

    def __init__(self, target: str) -> None:
        super().__init__("ABORTED", f"{target}: an operation on it is in progress")
