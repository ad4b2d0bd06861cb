"""Size limits shared by model I/O and the passes."""

from __future__ import annotations

__all__ = ["PROTOBUF_LIMIT", "PROTOBUF_MAX"]

#: protobuf cannot parse or serialise a message of this many bytes or more.
PROTOBUF_MAX = 2**31
#: What we let a serialised model reach: clear of ``PROTOBUF_MAX`` by 16 MiB of headroom.
PROTOBUF_LIMIT = PROTOBUF_MAX - 2**24
