"""HDFS's exceptions, as WebHDFS names them in a ``RemoteException`` body.

Each class carries the short ``exception`` name, the ``javaClassName`` and the HTTP
status WebHDFS's ``ExceptionHandler`` answers with (``FileNotFoundException`` 404;
``IllegalArgumentException``/``UnsupportedOperationException`` 400;
``AccessControlException`` and every other ``IOException`` 403). They are plain
exceptions, not ``ScribaError``\\ s: they are answers of the namespace, carried inside
apply results, never failures of Scriba.

:class:`EditLogError` is different: an edit record this code cannot read (an unknown
opcode or record version, a malformed body). Raised from ``apply`` it stops the
replica (``StateMachineError``) — a record is never skipped.
"""

from __future__ import annotations

from typing import Any, ClassVar


class HdfsError(Exception):
    exception: ClassVar[str] = "IOException"
    java_class: ClassVar[str] = "java.io.IOException"
    http_status: ClassVar[int] = 403

    def remote_exception(self) -> dict[str, Any]:
        return {"RemoteException": {"exception": self.exception, "javaClassName": self.java_class,
                                    "message": str(self)}}


class FileNotFoundException(HdfsError):
    exception, java_class, http_status = "FileNotFoundException", "java.io.FileNotFoundException", 404


class FileAlreadyExistsException(HdfsError):
    exception, java_class = "FileAlreadyExistsException", "org.apache.hadoop.fs.FileAlreadyExistsException"


class ParentNotDirectoryException(HdfsError):
    exception, java_class = "ParentNotDirectoryException", "org.apache.hadoop.fs.ParentNotDirectoryException"


class PathIsNotEmptyDirectoryException(HdfsError):
    exception = "PathIsNotEmptyDirectoryException"
    java_class = "org.apache.hadoop.fs.PathIsNotEmptyDirectoryException"


class AlreadyBeingCreatedException(HdfsError):
    exception = "AlreadyBeingCreatedException"
    java_class = "org.apache.hadoop.hdfs.protocol.AlreadyBeingCreatedException"


class LeaseExpiredException(HdfsError):
    """A block or completion for a file no longer under construction by this writer."""

    exception = "LeaseExpiredException"
    java_class = "org.apache.hadoop.hdfs.server.namenode.LeaseExpiredException"


class AccessControlException(HdfsError):
    exception, java_class = "AccessControlException", "org.apache.hadoop.security.AccessControlException"


class StandbyException(HdfsError):
    exception, java_class = "StandbyException", "org.apache.hadoop.ipc.StandbyException"


class RetriableException(HdfsError):
    exception, java_class = "RetriableException", "org.apache.hadoop.ipc.RetriableException"


class IllegalArgumentException(HdfsError):
    exception, java_class, http_status = "IllegalArgumentException", "java.lang.IllegalArgumentException", 400


class InvalidPathException(IllegalArgumentException):
    exception, java_class = "InvalidPathException", "org.apache.hadoop.fs.InvalidPathException"


class UnsupportedOperationException(HdfsError):
    exception = "UnsupportedOperationException"
    java_class = "java.lang.UnsupportedOperationException"
    http_status = 400


_BY_NAME: dict[str, type[HdfsError]] = {
    cls.exception: cls for cls in (
        HdfsError, FileNotFoundException, FileAlreadyExistsException, ParentNotDirectoryException,
        PathIsNotEmptyDirectoryException, AlreadyBeingCreatedException, LeaseExpiredException,
        AccessControlException, StandbyException, RetriableException, IllegalArgumentException, InvalidPathException,
        UnsupportedOperationException,
    )
}


def error_from(name: str, message: str) -> HdfsError:
    """The exception an apply/query result names (``HdfsError`` for an unknown name)."""
    return _BY_NAME.get(name, HdfsError)(message)


class EditLogError(Exception):
    """An edit record that cannot be replayed (unknown opcode or version, bad body)."""
