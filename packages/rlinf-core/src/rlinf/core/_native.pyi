"""Type stubs for the compiled extension built from ``crates/channel``."""

SEGMENT_PREFIX: str

def version() -> str:
    """Version of the native extension (the ``rlinf-channel`` crate)."""

def segment_name(namespace: str, channel: str) -> str:
    """Shared-memory segment name for ``channel`` in run ``namespace``; ValueError if invalid."""

def parse_segment_name(name: str) -> tuple[str, str] | None:
    """``(namespace, channel)`` of a name built by :func:`segment_name`, else None."""
