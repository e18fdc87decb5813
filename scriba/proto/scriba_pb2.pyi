from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Status]
    NO_SUCH_LEDGER: _ClassVar[Status]
    NO_SUCH_ENTRY: _ClassVar[Status]
    FENCED: _ClassVar[Status]
    UNAUTHORIZED: _ClassVar[Status]
    READ_ONLY: _ClassVar[Status]
    BAD_REQUEST: _ClassVar[Status]
    TOO_MANY_REQUESTS: _ClassVar[Status]
    CORRUPT: _ClassVar[Status]
    INTERNAL: _ClassVar[Status]
    TIMEOUT: _ClassVar[Status]
    UNAVAILABLE: _ClassVar[Status]

class AddFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADD_FLAG_NONE: _ClassVar[AddFlag]
    RECOVERY_ADD: _ClassVar[AddFlag]

class ReadFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_FLAG_NONE: _ClassVar[ReadFlag]
    FENCE: _ClassVar[ReadFlag]

class BookieState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BOOKIE_STATE_UNKNOWN: _ClassVar[BookieState]
    BOOKIE_READ_WRITE: _ClassVar[BookieState]
    BOOKIE_READ_ONLY: _ClassVar[BookieState]
    BOOKIE_SHUTTING_DOWN: _ClassVar[BookieState]
OK: Status
NO_SUCH_LEDGER: Status
NO_SUCH_ENTRY: Status
FENCED: Status
UNAUTHORIZED: Status
READ_ONLY: Status
BAD_REQUEST: Status
TOO_MANY_REQUESTS: Status
CORRUPT: Status
INTERNAL: Status
TIMEOUT: Status
UNAVAILABLE: Status
ADD_FLAG_NONE: AddFlag
RECOVERY_ADD: AddFlag
READ_FLAG_NONE: ReadFlag
FENCE: ReadFlag
BOOKIE_STATE_UNKNOWN: BookieState
BOOKIE_READ_WRITE: BookieState
BOOKIE_READ_ONLY: BookieState
BOOKIE_SHUTTING_DOWN: BookieState

class AddRequest(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "master_key", "flags", "entry")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    master_key: bytes
    flags: int
    entry: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., flags: _Optional[int] = ..., entry: _Optional[bytes] = ...) -> None: ...

class AddRun(_message.Message):
    __slots__ = ("ledger_id", "master_key", "flags", "entry_ids", "sizes", "entries")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    master_key: bytes
    flags: int
    entry_ids: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    entries: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., flags: _Optional[int] = ..., entry_ids: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., entries: _Optional[bytes] = ...) -> None: ...

class AddBatch(_message.Message):
    __slots__ = ("adds", "runs")
    ADDS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    adds: _containers.RepeatedCompositeFieldContainer[AddRequest]
    runs: _containers.RepeatedCompositeFieldContainer[AddRun]
    def __init__(self, adds: _Optional[_Iterable[_Union[AddRequest, _Mapping]]] = ..., runs: _Optional[_Iterable[_Union[AddRun, _Mapping]]] = ...) -> None: ...

class AddResponse(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "status", "message")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    status: Status
    message: str
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class AddRunResponse(_message.Message):
    __slots__ = ("ledger_id", "entry_ids", "status", "message")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_ids: _containers.RepeatedScalarFieldContainer[int]
    status: Status
    message: str
    def __init__(self, ledger_id: _Optional[int] = ..., entry_ids: _Optional[_Iterable[int]] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class AddResponseBatch(_message.Message):
    __slots__ = ("responses", "runs")
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[AddResponse]
    runs: _containers.RepeatedCompositeFieldContainer[AddRunResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[AddResponse, _Mapping]]] = ..., runs: _Optional[_Iterable[_Union[AddRunResponse, _Mapping]]] = ...) -> None: ...

class ReadEntryRequest(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "flags", "master_key")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    flags: int
    master_key: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., flags: _Optional[int] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class ReadEntryResponse(_message.Message):
    __slots__ = ("status", "ledger_id", "entry_id", "entry", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    ledger_id: int
    entry_id: int
    entry: bytes
    message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., entry: _Optional[bytes] = ..., message: _Optional[str] = ...) -> None: ...

class ReadRangeRequest(_message.Message):
    __slots__ = ("ledger_id", "first_entry_id", "last_entry_id", "max_entries", "max_bytes", "flags", "master_key", "packed")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    max_entries: int
    max_bytes: int
    flags: int
    master_key: bytes
    packed: bool
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., max_entries: _Optional[int] = ..., max_bytes: _Optional[int] = ..., flags: _Optional[int] = ..., master_key: _Optional[bytes] = ..., packed: _Optional[bool] = ...) -> None: ...

class ReadRangeResponse(_message.Message):
    __slots__ = ("status", "first_entry_id", "entries", "message", "sizes", "packed_entries")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    PACKED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    status: Status
    first_entry_id: int
    entries: _containers.RepeatedScalarFieldContainer[bytes]
    message: str
    sizes: _containers.RepeatedScalarFieldContainer[int]
    packed_entries: bytes
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., first_entry_id: _Optional[int] = ..., entries: _Optional[_Iterable[bytes]] = ..., message: _Optional[str] = ..., sizes: _Optional[_Iterable[int]] = ..., packed_entries: _Optional[bytes] = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledger_id", "flags", "master_key", "long_poll", "previous_lac", "timeout_ms", "piggyback_entry", "piggyback_entries_max")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    LONG_POLL_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PIGGYBACK_ENTRY_FIELD_NUMBER: _ClassVar[int]
    PIGGYBACK_ENTRIES_MAX_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    flags: int
    master_key: bytes
    long_poll: bool
    previous_lac: int
    timeout_ms: int
    piggyback_entry: bool
    piggyback_entries_max: int
    def __init__(self, ledger_id: _Optional[int] = ..., flags: _Optional[int] = ..., master_key: _Optional[bytes] = ..., long_poll: _Optional[bool] = ..., previous_lac: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., piggyback_entry: _Optional[bool] = ..., piggyback_entries_max: _Optional[int] = ...) -> None: ...

class ReadLacResponse(_message.Message):
    __slots__ = ("status", "lac", "last_entry_id", "last_entry", "piggybacked_entry", "fenced", "message", "piggybacked_entries")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    PIGGYBACKED_ENTRY_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PIGGYBACKED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    status: Status
    lac: int
    last_entry_id: int
    last_entry: bytes
    piggybacked_entry: bytes
    fenced: bool
    message: str
    piggybacked_entries: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., lac: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., last_entry: _Optional[bytes] = ..., piggybacked_entry: _Optional[bytes] = ..., fenced: _Optional[bool] = ..., message: _Optional[str] = ..., piggybacked_entries: _Optional[_Iterable[bytes]] = ...) -> None: ...

class WriteLacRequest(_message.Message):
    __slots__ = ("ledger_id", "lac", "master_key", "hint_only")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    HINT_ONLY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    lac: int
    master_key: bytes
    hint_only: bool
    def __init__(self, ledger_id: _Optional[int] = ..., lac: _Optional[int] = ..., master_key: _Optional[bytes] = ..., hint_only: _Optional[bool] = ...) -> None: ...

class WriteLacResponse(_message.Message):
    __slots__ = ("status", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class BookieInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BookieInfoResponse(_message.Message):
    __slots__ = ("status", "bookie_id", "state", "free_bytes", "total_bytes", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    bookie_id: str
    state: BookieState
    free_bytes: int
    total_bytes: int
    message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., bookie_id: _Optional[str] = ..., state: _Optional[_Union[BookieState, str]] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...
